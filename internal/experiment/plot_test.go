package experiment

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPlotPNG draws a log-scale plot and a CDF and checks that each is a
// PNG of the promised size with the series' colour in it.
func TestPlotPNG(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []*plot{
		{title: "log", xlabel: "time (s)", ylabel: "req/s", logY: true, shade: [][2]float64{{30, 60}},
			series: []series{{"served", palette[0], []float64{5, 15, 25, 35}, []float64{120, 3, 0, 80}}}},
		{title: "cdf", xlabel: "s", ylabel: "done",
			series: []series{cdfSeries("x", palette[0], []time.Duration{3 * time.Second, 7 * time.Second}, 2)}},
	} {
		path := filepath.Join(dir, p.title+".png")
		if err := p.writePNG(path); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
			t.Fatalf("%s: %v, want %dx%d", p.title, b, plotW, plotH)
		}
		found := false
		for y := 0; y < plotH && !found; y++ {
			for x := 0; x < plotW; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == palette[0].R && uint8(g>>8) == palette[0].G && uint8(b>>8) == palette[0].B {
					found = true
					break
				}
			}
		}
		if !found {
			t.Fatalf("%s: no pixel of the series colour", p.title)
		}
	}
}
