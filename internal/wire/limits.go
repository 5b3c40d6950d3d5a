package wire

// Limits of the protocol, enforced by every storage server on requests
// from client nodes (server/limits.go) and honoured by the client core.
// The POSIX-visible ones are Linux's, so applications see the errors they
// expect: NAME_MAX, PATH_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX, XATTR_LIST_MAX.
const (
	// MaxMessageSize bounds one gRPC message in either direction, between
	// clients and servers and between servers (both sides set it). The
	// largest legitimate messages are a server's: a Replicate call (8 MiB
	// of blocks plus up to 256 batches), a snapshot chunk of 1024 objects,
	// and a Commit's block list (about 45 bytes per 64 KiB block: a file
	// of some 90 GiB rewritten in one open). gRPC refuses a larger
	// message with ResourceExhausted before any handler runs, and reads
	// a message as its bytes arrive, so the bound is what one call in
	// flight can cost the receiver.
	MaxMessageSize = 64 << 20

	// NameMax is the longest name in a directory, in bytes (NAME_MAX).
	NameMax = 255
	// PathMax bounds a symbolic link's target, in bytes, with its
	// terminating NUL (PATH_MAX): targets of up to PathMax-1 bytes.
	PathMax = 4096
	// XattrNameMax is the longest extended attribute name (XATTR_NAME_MAX).
	XattrNameMax = 255
	// XattrSizeMax is the largest extended attribute value (XATTR_SIZE_MAX).
	XattrSizeMax = 64 << 10
	// XattrListMax bounds the names of one object's extended attributes
	// together, each with its NUL (XATTR_LIST_MAX), so listxattr fits.
	XattrListMax = 64 << 10
	// XattrTotalMax bounds names and values of one object's extended
	// attributes together (ext4 allows a block; we allow more).
	XattrTotalMax = 1 << 20

	// MaxBlocksPerCall bounds the blocks of one ReadBlocks or PutBlocks
	// call (16 MiB of 64 KiB blocks; the client sends 16).
	MaxBlocksPerCall = 256
	// MaxBlockRefs bounds the block range of one GetBlocks call (the
	// client asks for 1024).
	MaxBlockRefs = 4096
	// MaxAdopt bounds Caller.adopt: a mutation changes a few objects.
	MaxAdopt = 8
	// MaxSyncChanges bounds the changes one Sync call waits for (a
	// create leaves one or two per slice).
	MaxSyncChanges = 64
	// MaxFileSize is the largest file size (far below 2^63, so that block
	// index arithmetic cannot overflow).
	MaxFileSize = 1 << 60
	// MaxGroups bounds a caller's supplementary groups (NGROUPS_MAX).
	MaxGroups = 65536
	// MaxListEntries and MaxListBytes bound one ReadDir answer; a longer
	// listing continues (ReadDirRequest.after, ReadDirResponse.eof).
	MaxListEntries = 4096
	MaxListBytes   = 1 << 20
	// MaxHolderRanges bounds the block ranges of a Holders question (the
	// client asks for one); MaxHeldFiles bounds the files of one
	// ReportHolding call (the client reports at most 4096; the holder
	// table bounds the ranges it keeps).
	MaxHolderRanges = 1024
	MaxHeldFiles    = 4096
	// MaxCueString bounds the strings of cues and placement hints
	// (site names, node IDs).
	MaxCueString = 255
)
