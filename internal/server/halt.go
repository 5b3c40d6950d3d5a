package server

// Freeze stops lock renewal until Thaw, as if the process had stopped
// running: its locks expire and another server may take its slices over.
// The caller (deploy) also holds incoming RPCs.
func (s *Server) Freeze() { s.paused.Store(true) }

// Thaw undoes Freeze. The server finds out on its next renewal whether it
// lost its locks meanwhile; until then the fencing epochs stop any write
// it tries to replicate.
func (s *Server) Thaw() { s.paused.Store(false) }

// Halt stops the server as a crash would: background work ends, no lock is
// released and nothing more is written. Use Close for an orderly stop.
func (s *Server) Halt() { s.stop() }
