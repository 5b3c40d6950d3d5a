package deploy_test

import (
	"context"
	"testing"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
)

// BenchmarkConfigRequest measures configuration-service round trips (a
// put and a linearizable get under the prefix; a get alone) from a host's own etcd
// client over mutual TLS, with etcd's authentication off and on (a user
// per certificate name: etcd then looks the user and its role's ranges
// up for every request).
//
//	go test ./internal/deploy -run '^$' -bench ConfigRequest -benchtime 3000x -count 3
func BenchmarkConfigRequest(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "auth=off"
		if on {
			name = "auth=on"
		}
		b.Run(name, func(b *testing.B) {
			h := deploytest.Start(b, func(c *deploy.Config) { c.ConfigAuth = on })
			cli := h.Conf.(*configsvc.EtcdService).Client()
			ctx := context.Background()
			const key = "/wheelfs/bench"
			if _, err := cli.Put(ctx, key, "v"); err != nil {
				b.Fatal(err)
			}
			b.Run("put+get", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := cli.Put(ctx, key, "v"); err != nil {
						b.Fatal(err)
					}
					if _, err := cli.Get(ctx, key); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("get", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := cli.Get(ctx, key); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
