// Package e2e holds the FUSE end-to-end tests: they run the real wheelfs
// binary with a real mount and drive it through the kernel (see
// main_test.go). The package has no non-test code.
package e2e
