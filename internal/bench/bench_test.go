package bench

import "testing"

func TestMedianOf(t *testing.T) {
	rate := func(r float64) *Measurement { return &Measurement{Rate: r} }
	runs := []map[string]*Measurement{
		{Create: rate(3), Unlink: rate(10)},
		{Create: rate(1), Unlink: &Measurement{Error: "unlink f0000001: EIO"}},
		{Create: rate(2)},
	}
	if m := medianOf(runs, Create); m.Rate != 2 {
		t.Errorf("median create %v, want 2", m.Rate)
	}
	if m := medianOf(runs, Unlink); m.Error != "unlink f0000001: EIO" {
		t.Errorf("unlink %+v, want the failure", m)
	}
	if m := medianOf(runs[:1], Stat); m.Error == "" {
		t.Errorf("a workload that never ran: %+v", m)
	}
	if !failedAny(runs[1], []string{Create, Unlink}) || failedAny(runs[0], []string{Create, Unlink}) ||
		!failedAny(runs[2], []string{Create, Unlink}) {
		t.Error("failedAny")
	}
}
