// Package wire holds the protocol buffers exchanged between WheelFS clients
// and storage servers. It imports nothing from the rest of the project.
package wire

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative wheelfs.proto

// SetAttr valid bits (SetAttrRequest.valid).
const (
	SetMode uint32 = 1 << iota
	SetUID
	SetGID
	SetSize
	SetAtime
	SetMtime
)

// Rename flags (RenameRequest.flags), as in renameat2(2).
const (
	RenameNoReplace uint32 = 1
	RenameExchange  uint32 = 2
	// RenameWhiteout is refused (EINVAL): WheelFS has no whiteouts.
	RenameWhiteout uint32 = 4
)
