package cli

import (
	"log/slog"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on the default mux
)

// servePprof exposes profiles for diagnosing a running mount.
func servePprof(addr string, log *slog.Logger) {
	srv := &http.Server{Addr: addr}
	go func() {
		if err := srv.ListenAndServe(); err != nil {
			log.Warn("pprof server stopped", "err", err)
		}
	}()
}
