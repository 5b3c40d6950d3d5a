// Package testbed brings up a multi-site WheelFS on one Linux machine with
// real processes: one network namespace per host, one per site (a bridge
// and the site's uplink, rate-limited by a tbf qdisc) and one for the wide
// area, where a user-space delay router holds every packet for its site
// pair's one-way delay (this kernel has no netem) and drops the packets of
// cut pairs. Hosts run `wheelfs config`, `wheelfs node` and `wheelfs mount`
// processes whose FUSE mounts appear under the testbed directory in the
// caller's mount namespace. All state is kept in DIR/testbed.json, written
// before each resource is made, so `down` removes everything, also after a
// crash of the testbed command.
package testbed
