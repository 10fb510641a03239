package replay

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// series is one line of a chart.
type series struct {
	Name   string
	Color  string
	Dashed bool
	Values []float64
}

// palette colours tenants and domains in order.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

const (
	chartW, chartH   = 640, 220
	padL, padR       = 60, 110
	padT, padB       = 24, 30
	plotW, plotH     = chartW - padL - padR, chartH - padT - padB
	maxPointsPerLine = 1200
)

// niceMax rounds v up to 1, 2 or 5 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// lineChart draws series over time (one value per second) as an inline
// SVG: axes, the y maximum, the time span and a legend. Long series are
// reduced to at most maxPointsPerLine points by averaging.
func lineChart(title, yUnit string, ss []series) template.HTML {
	n, ymax := 0, 0.0
	for _, s := range ss {
		n = max(n, len(s.Values))
		for _, v := range s.Values {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceMax(ymax)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img"><title>%s</title>`,
		chartW, chartH, chartW, chartH, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`, padL, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT, padL, padT+plotH)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT+plotH, padL+plotW, padT+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">%s</text>`, padL-4, padT+8, template.HTMLEscapeString(fmtNum(ymax)+" "+yUnit))
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">0</text>`, padL-4, padT+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">0 s</text>`, padL, padT+plotH+16)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">%d s</text>`, padL+plotW, padT+plotH+16, n)
	step := max(1, (n+maxPointsPerLine-1)/maxPointsPerLine)
	for i, s := range ss {
		var pts strings.Builder
		for x := 0; x < len(s.Values); x += step {
			sum, k := 0.0, 0
			for j := x; j < min(x+step, len(s.Values)); j++ {
				sum += s.Values[j]
				k++
			}
			px := float64(padL) + float64(plotW)*float64(x)/float64(max(n-1, 1))
			py := float64(padT+plotH) - float64(plotH)*(sum/float64(k))/ymax
			fmt.Fprintf(&pts, "%.1f,%.1f ", px, py)
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="5,3"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.3"%s points="%s"/>`, s.Color, dash, strings.TrimSpace(pts.String()))
		ly := padT + 12 + 16*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, padL+plotW+8, ly-4, padL+plotW+24, ly-4, s.Color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">%s</text>`, padL+plotW+28, ly, template.HTMLEscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // every string inside is escaped above
}

// barChart draws grouped bars: one group per label, one bar per series.
func barChart(title, yUnit string, labels []string, ss []series) template.HTML {
	ymax := 0.0
	for _, s := range ss {
		for _, v := range s.Values {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceMax(ymax)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img"><title>%s</title>`,
		chartW, chartH, chartW, chartH, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`, padL, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT+plotH, padL+plotW, padT+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">%s</text>`, padL-4, padT+8, template.HTMLEscapeString(fmtNum(ymax)+" "+yUnit))
	groupW := float64(plotW) / float64(max(len(labels), 1))
	barW := groupW * 0.8 / float64(max(len(ss), 1))
	for g, l := range labels {
		x0 := float64(padL) + groupW*float64(g) + groupW*0.1
		for i, s := range ss {
			v := 0.0
			if g < len(s.Values) {
				v = s.Values[g]
			}
			h := float64(plotH) * v / ymax
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`,
				x0+barW*float64(i), float64(padT+plotH)-h, barW, h, s.Color,
				template.HTMLEscapeString(l), template.HTMLEscapeString(s.Name), fmtNum(v))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>`, x0+groupW*0.4, padT+plotH+16, template.HTMLEscapeString(l))
	}
	for i, s := range ss {
		ly := padT + 12 + 16*i
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="10" fill="%s"/>`, padL+plotW+8, ly-9, s.Color)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">%s</text>`, padL+plotW+24, ly, template.HTMLEscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func fmtNum(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.3gk", v/1e3)
	}
	return fmt.Sprintf("%.4g", v)
}

func floats(v []int64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func constant(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// htmlPolicy is one policy's section of the HTML report.
type htmlPolicy struct {
	R       *Report
	Table   string
	Tenants []template.HTML
	Waits   template.HTML
	Util    template.HTML
}

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Sluice replay: {{.C.Trace}}</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1400px}pre{background:#f6f6f6;padding:1em;overflow-x:auto}
svg.chart{margin:4px;border:1px solid #ddd}section{margin-bottom:2em}</style></head>
<body><h1>Sluice replay</h1>
<p>Trace <code>{{.C.Trace}}</code>: {{.C.Rows}} requests, seed {{.C.Seed}}. Rates are weighted tokens per second
(prompt + output weight × output). Target is the weighted max-min fair share of what was admitted each second.</p>
<h2>Comparison</h2>
{{.Waits}}
{{.Floors}}
{{range .P}}<section><h2>Policy {{.R.Policy}}</h2>
<pre>{{.Table}}</pre>
{{.Waits}}
{{.Util}}
{{range .Tenants}}{{.}}{{end}}
</section>{{end}}
</body></html>
`))

// chart is one plot of a report, with a file name for WriteSVGs.
type chart struct {
	file string
	svg  template.HTML
}

// plots are the report's charts: the comparisons across policies and each
// policy's own.
type plots struct {
	Waits, Floors template.HTML
	P             []htmlPolicy
	all           []chart
}

// slug makes a file name of a chart's title.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-") + ".svg"
}

func (c *Comparison) plots() (*plots, error) {
	var labels []string
	if len(c.Reports) > 0 {
		for _, t := range c.Reports[0].Tenants {
			labels = append(labels, t.Name)
		}
	}
	pl := &plots{}
	add := func(title string, svg template.HTML) template.HTML {
		pl.all = append(pl.all, chart{slug(title), svg})
		return svg
	}
	var waits, floors []series
	for i, r := range c.Reports {
		col := palette[i%len(palette)]
		ws := series{Name: r.Policy, Color: col}
		fs := series{Name: r.Policy, Color: col}
		for _, t := range r.Tenants {
			ws.Values = append(ws.Values, t.WaitP99)
			fs.Values = append(fs.Values, float64(t.FloorViolations))
		}
		waits, floors = append(waits, ws), append(floors, fs)
		one := &Comparison{Trace: c.Trace, Rows: c.Rows, Seed: c.Seed, Reports: []*Report{r}}
		var tb strings.Builder
		if err := one.WriteTable(&tb); err != nil {
			return nil, err
		}
		hp := htmlPolicy{R: r, Table: tb.String()}
		for _, t := range r.Tenants {
			n := len(t.Achieved)
			title := fmt.Sprintf("%s: %s tokens/s", r.Policy, t.Name)
			hp.Tenants = append(hp.Tenants, add(title, lineChart(title, "tok/s", []series{
				{Name: "achieved", Color: palette[0], Values: floats(t.Achieved)},
				{Name: "fair share", Color: palette[2], Dashed: true, Values: floats(t.Target)},
				{Name: "floor", Color: palette[1], Dashed: true, Values: constant(float64(t.Floor), n)},
			})))
		}
		var wsr []series
		for j, t := range r.Tenants {
			wsr = append(wsr, series{Name: t.Name, Color: palette[j%len(palette)], Values: t.WaitMaxPerS})
		}
		title := r.Policy + ": longest queue wait per second"
		hp.Waits = add(title, lineChart(title, "ms", wsr))
		var us []series
		for j, d := range r.Domains {
			us = append(us, series{Name: d.ID, Color: palette[j%len(palette)], Values: d.PrefillPerS})
		}
		title = r.Policy + ": prefill utilization per domain"
		hp.Util = add(title, lineChart(title, "", us))
		pl.P = append(pl.P, hp)
	}
	pl.Waits = add("queue wait p99 by tenant", barChart("queue wait p99 by tenant", "ms", labels, waits))
	pl.Floors = add("floor violations by tenant", barChart("floor violations by tenant", "s", labels, floors))
	return pl, nil
}

// WriteHTML writes c as one self-contained HTML page: the tables, and
// inline SVG plots (no scripts, no external resources) of each tenant's
// tokens/s against its fair share and floor, the longest wait per second
// by tenant, each domain's prefill utilization, and the policies' p99
// waits and floor violations side by side.
func (c *Comparison) WriteHTML(w io.Writer) error {
	pl, err := c.plots()
	if err != nil {
		return err
	}
	err = reportTmpl.Execute(w, struct {
		C *Comparison
		*plots
	}{c, pl})
	if err != nil {
		return fmt.Errorf("html: %w", err)
	}
	return nil
}

// WriteSVGs writes each of the HTML report's plots to its own SVG file in
// dir (created if missing), named after its title, e.g.
// sluice-longest-queue-wait-per-second.svg, and returns the file names.
func (c *Comparison) WriteSVGs(dir string) ([]string, error) {
	pl, err := c.plots()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--svg: %w", err)
	}
	var names []string
	for _, ch := range pl.all {
		if err := os.WriteFile(filepath.Join(dir, ch.file), []byte(string(ch.svg)+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("--svg: %w", err)
		}
		names = append(names, ch.file)
	}
	return names, nil
}
