// Package server is a WheelFS storage server: it holds slice locks from the
// configuration service, stores the objects of the slices it is primary for
// in a crash-safe local store, enforces UNIX permissions on the calling user,
// and answers clients over gRPC.
//
// One file per concern:
//
//	server.go      Config, the Server struct, New, Start, Close
//	doc.go         this overview
//	admit.go       admission of every request: primary, or backup (eventual)
//	slices.go      slice ownership: locks, renewal, serving and losing slices
//	placement.go   where new objects and replicas go; suspected servers
//	update.go      the update path: transaction, leases, replication, backup mode
//	namelock.go    per-name locks that serialize namespace changes
//	namespace.go   Lookup, GetAttr, Create, Link, Remove, SetAttr, ReadDir
//	rename.go      Rename and exchange within one server
//	xrename.go     Rename between servers (three durable steps)
//	data.go        block reads and writes, Commit, truncate, StatFS
//	xattr.go       extended attributes
//	opens.go       open handles and orphans (unlinked while open)
//	lease.go       meta-data leases and client callbacks
//	peerops.go     work other servers ask of this one (create, add link)
//	outgoing.go    every call to another server's Peer service
//	peer.go        thin handlers of the Peer service
//	edge.go        the gRPC edge: peer authentication, error mapping
//	repl.go        the replication stream from primary to backups
//	backup.go      the backup side: epoch fencing, applying the stream
//	snapshot.go    digests, diffs and snapshot installs of a slice
//	maint.go       maintenance: takeover, tending replicas, hand-over
//	diverge.go     divergence records of changes made in backup mode
//	tombstone.go   tombstones of removed names
//	reconcile.go   merge rules and merging pushed changes at the primary
//	antientropy.go pushing changes, digest comparison, tombstone collection
//	local.go       the in-process Storage client
//	halt.go        fault-test hooks (Freeze, Thaw, Halt)
package server
