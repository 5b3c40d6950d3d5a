package experiment

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strings"
)

// A tiny line plot written with the standard library only (the module has
// no plotting dependency): axes with ticks, lines, shaded x ranges and a
// legend, in a 3×5 pixel font scaled ×2.

type series struct {
	name  string
	color color.RGBA
	xs    []float64
	ys    []float64
}

type plot struct {
	title, xlabel, ylabel string
	logY                  bool
	series                []series
	shade                 [][2]float64 // x ranges drawn grey (failures)
}

var (
	black   = color.RGBA{0, 0, 0, 255}
	grey    = color.RGBA{225, 225, 225, 255}
	grid    = color.RGBA{200, 200, 200, 255}
	palette = []color.RGBA{{200, 30, 30, 255}, {30, 90, 200, 255}, {20, 150, 60, 255}, {160, 90, 10, 255}, {130, 40, 160, 255}, {0, 140, 150, 255}}
)

const (
	plotW, plotH             = 900, 480
	marginL, marginR         = 80, 20
	marginT, marginB         = 40, 50
	glyphScale               = 2
	glyphW, glyphH, glyphGap = 3, 5, 1
)

func (p *plot) writePNG(path string) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.series {
		for i := range s.xs {
			if p.logY && s.ys[i] <= 0 {
				continue
			}
			x0, x1 = math.Min(x0, s.xs[i]), math.Max(x1, s.xs[i])
			y0, y1 = math.Min(y0, s.ys[i]), math.Max(y1, s.ys[i])
		}
	}
	if math.IsInf(x0, 0) {
		return fmt.Errorf("nothing to plot")
	}
	if x0 > 0 {
		x0 = 0
	}
	if p.logY {
		y0, y1 = math.Pow(10, math.Floor(math.Log10(y0))), math.Pow(10, math.Ceil(math.Log10(y1)))
		if y0 == y1 {
			y1 *= 10
		}
	} else {
		y0 = 0
		y1 = niceCeil(y1)
	}
	if x1 == x0 {
		x1 = x0 + 1
	}
	pw, ph := float64(plotW-marginL-marginR), float64(plotH-marginT-marginB)
	px := func(x float64) int { return marginL + int((x-x0)/(x1-x0)*pw) }
	py := func(y float64) int {
		var f float64
		if p.logY {
			f = (math.Log10(y) - math.Log10(y0)) / (math.Log10(y1) - math.Log10(y0))
		} else {
			f = (y - y0) / (y1 - y0)
		}
		return plotH - marginB - int(f*ph)
	}
	for _, r := range p.shade {
		for x := px(r[0]); x <= px(r[1]) && x < plotW-marginR; x++ {
			for y := marginT; y <= plotH-marginB; y++ {
				img.Set(x, y, grey)
			}
		}
	}
	// Y ticks.
	var yt []float64
	if p.logY {
		for v := y0; v <= y1*1.001; v *= 10 {
			yt = append(yt, v)
		}
	} else {
		step := niceStep(y1 / 5)
		for v := 0.0; v <= y1*1.001; v += step {
			yt = append(yt, v)
		}
	}
	for _, v := range yt {
		y := py(v)
		hline(img, marginL, plotW-marginR, y, grid)
		label := trimFloat(v)
		drawText(img, marginL-6-textWidth(label), y-glyphH*glyphScale/2, label, black)
	}
	xs := niceStep((x1 - x0) / 8)
	for v := math.Ceil(x0/xs) * xs; v <= x1*1.001; v += xs {
		x := px(v)
		vline(img, x, marginT, plotH-marginB, grid)
		label := trimFloat(v)
		drawText(img, x-textWidth(label)/2, plotH-marginB+6, label, black)
	}
	hline(img, marginL, plotW-marginR, plotH-marginB, black)
	vline(img, marginL, marginT, plotH-marginB, black)
	for _, s := range p.series {
		prevOK := false
		var lx, ly int
		for i := range s.xs {
			v := s.ys[i]
			if p.logY && v < y0 {
				v = y0 // zero sits on the bottom axis
			}
			x, y := px(s.xs[i]), py(v)
			if prevOK {
				line(img, lx, ly, x, y, s.color)
			} else {
				dot(img, x, y, s.color)
			}
			lx, ly, prevOK = x, y, true
		}
	}
	drawText(img, marginL, 12, p.title, black)
	drawText(img, marginL+int(pw)/2-textWidth(p.xlabel)/2, plotH-18, p.xlabel, black)
	drawText(img, 4, marginT-16, p.ylabel, black)
	// Legend, top right.
	ly := marginT + 6
	for _, s := range p.series {
		w := textWidth(s.name)
		lx := plotW - marginR - w - 30
		for d := 0; d < 3; d++ {
			hline(img, lx, lx+18, ly+4+d, s.color)
		}
		drawText(img, lx+24, ly, s.name, black)
		ly += 16
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	s := niceStep(v / 5)
	return math.Ceil(v/s) * s
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	s := fmt.Sprintf("%.2f", v)
	return strings.TrimRight(strings.TrimRight(s, "0"), ".")
}

func hline(img *image.RGBA, xa, xb, y int, c color.RGBA) {
	for x := xa; x <= xb; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, ya, yb int, c color.RGBA) {
	for y := ya; y <= yb; y++ {
		img.Set(x, y, c)
	}
}

func dot(img *image.RGBA, x, y int, c color.RGBA) {
	for dx := -1; dx <= 1; dx++ {
		for dy := -1; dy <= 1; dy++ {
			img.Set(x+dx, y+dy, c)
		}
	}
}

// line draws a 2-pixel line (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		img.Set(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

func textWidth(s string) int { return len(s) * (glyphW + glyphGap) * glyphScale }

func drawText(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		g, ok := glyphs[r]
		if ok {
			for row, bits := range g {
				for col, b := range bits {
					if b != '#' {
						continue
					}
					for sx := 0; sx < glyphScale; sx++ {
						for sy := 0; sy < glyphScale; sy++ {
							img.Set(x+col*glyphScale+sx, y+row*glyphScale+sy, c)
						}
					}
				}
			}
		}
		x += (glyphW + glyphGap) * glyphScale
	}
}

// glyphs is a 3×5 font: digits, letters (drawn as capitals) and a few signs.
var glyphs = map[rune][5]string{
	'0': {"###", "#.#", "#.#", "#.#", "###"}, '1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"}, '3': {"###", "..#", ".##", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"}, '5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"}, '7': {"###", "..#", ".#.", ".#.", ".#."},
	'8': {"###", "#.#", "###", "#.#", "###"}, '9': {"###", "#.#", "###", "..#", "###"},
	'a': {".#.", "#.#", "###", "#.#", "#.#"}, 'b': {"##.", "#.#", "##.", "#.#", "##."},
	'c': {".##", "#..", "#..", "#..", ".##"}, 'd': {"##.", "#.#", "#.#", "#.#", "##."},
	'e': {"###", "#..", "##.", "#..", "###"}, 'f': {"###", "#..", "##.", "#..", "#.."},
	'g': {".##", "#..", "#.#", "#.#", ".##"}, 'h': {"#.#", "#.#", "###", "#.#", "#.#"},
	'i': {"###", ".#.", ".#.", ".#.", "###"}, 'j': {"..#", "..#", "..#", "#.#", ".#."},
	'k': {"#.#", "#.#", "##.", "#.#", "#.#"}, 'l': {"#..", "#..", "#..", "#..", "###"},
	'm': {"#.#", "###", "###", "#.#", "#.#"}, 'n': {"##.", "#.#", "#.#", "#.#", "#.#"},
	'o': {".#.", "#.#", "#.#", "#.#", ".#."}, 'p': {"##.", "#.#", "##.", "#..", "#.."},
	'q': {".#.", "#.#", "#.#", "##.", ".##"}, 'r': {"##.", "#.#", "##.", "#.#", "#.#"},
	's': {".##", "#..", ".#.", "..#", "##."}, 't': {"###", ".#.", ".#.", ".#.", ".#."},
	'u': {"#.#", "#.#", "#.#", "#.#", ".##"}, 'v': {"#.#", "#.#", "#.#", ".#.", ".#."},
	'w': {"#.#", "#.#", "###", "###", "#.#"}, 'x': {"#.#", "#.#", ".#.", "#.#", "#.#"},
	'y': {"#.#", "#.#", ".#.", ".#.", ".#."}, 'z': {"###", "..#", ".#.", "#..", "###"},
	'.': {"...", "...", "...", "...", ".#."}, '-': {"...", "...", "###", "...", "..."},
	'/': {"..#", "..#", ".#.", "#..", "#.."}, '%': {"#.#", "..#", ".#.", "#..", "#.#"},
	':': {"...", ".#.", "...", ".#.", "..."}, '(': {"..#", ".#.", ".#.", ".#.", "..#"},
	')': {"#..", ".#.", ".#.", ".#.", "#.."}, '=': {"...", "###", "...", "###", "..."},
	',': {"...", "...", "...", ".#.", "#.."}, '+': {"...", ".#.", "###", ".#.", "..."},
}
