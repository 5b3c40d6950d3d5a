// Package archtest holds tests that keep the project's layout honest: every
// package documented, and dependencies pointing the way
// docs/ARCHITECTURE.md says they do.
package archtest
