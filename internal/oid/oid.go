// Package oid defines object identifiers. An ID is 64 bits: the top SliceBits
// name the slice (the unit of placement and replication, paper §5.2) and the
// rest are a per-slice counter allocated by the slice's primary.
package oid

import "fmt"

// SliceBits is the width of the slice part of an ID. 20 bits allow a million
// distinct slices (placement policies × servers), far above the paper's 4096.
const SliceBits = 20

// counterBits is the width of the per-slice counter.
const counterBits = 64 - SliceBits

// MaxCounter is the largest counter value in a slice.
const MaxCounter = 1<<counterBits - 1

// ID names one object (file, directory or symlink) for its whole life.
type ID uint64

// Slice is a slice number (the top SliceBits of an ID).
type Slice uint32

// RootSlice holds the root directory; it is created with the deployment.
const RootSlice Slice = 1

// Root is the ID of the file system's root directory.
var Root = Make(RootSlice, 1)

// Make builds an ID from a slice and a counter value.
func Make(s Slice, counter uint64) ID {
	return ID(uint64(s)<<counterBits | counter&MaxCounter)
}

// Slice returns the slice an ID belongs to.
func (id ID) Slice() Slice { return Slice(uint64(id) >> counterBits) }

// Counter returns the per-slice part of an ID.
func (id ID) Counter() uint64 { return uint64(id) & MaxCounter }

func (id ID) String() string { return fmt.Sprintf("%x.%x", uint64(id.Slice()), id.Counter()) }

// MaxSlice is the largest slice number.
const MaxSlice = 1<<SliceBits - 1
