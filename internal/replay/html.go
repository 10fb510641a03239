package replay

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
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

// svgHead starts a chart: the svg element, its title and the y axis with
// ticks at quarters of ymax, each with its value and a grid line.
func svgHead(b *strings.Builder, title, yUnit string, ymax float64) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img"><title>%s</title>`,
		chartW, chartH, chartW, chartH, template.HTMLEscapeString(title))
	fmt.Fprintf(b, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`, padL, template.HTMLEscapeString(title))
	for k := 0; k <= 4; k++ {
		y := float64(padT+plotH) - float64(plotH)*float64(k)/4
		if k > 0 {
			fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e4e4e4"/>`, padL, y, padL+plotW, y)
		}
		fmt.Fprintf(b, `<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>`, padL-4, y+3, fmtNum(ymax*float64(k)/4))
	}
	if yUnit != "" {
		fmt.Fprintf(b, `<text x="12" y="%d" font-size="10" text-anchor="middle" transform="rotate(-90 12 %d)">%s</text>`,
			padT+plotH/2, padT+plotH/2, template.HTMLEscapeString(yUnit))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT, padL, padT+plotH)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT+plotH, padL+plotW, padT+plotH)
}

// tickStep is a step of 1, 2 or 5 times a power of ten that cuts span
// into at most about six parts.
func tickStep(span float64) float64 {
	return niceMax(span / 6)
}

// lineChart draws series over time (one value per second) as an inline
// SVG: axes with their values, the bursts' windows shaded and a legend.
// Long series are reduced to at most maxPointsPerLine points by averaging.
func lineChart(title, yUnit string, ss []series, bursts []Burst) template.HTML {
	n, ymax := 0, 0.0
	for _, s := range ss {
		n = max(n, len(s.Values))
		for _, v := range s.Values {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceMax(ymax)
	xAt := func(sec float64) float64 { return float64(padL) + float64(plotW)*sec/float64(max(n-1, 1)) }
	var b strings.Builder
	svgHead(&b, title, yUnit, ymax)
	for _, bu := range bursts {
		x0, x1 := xAt(math.Min(bu.From.Seconds(), float64(max(n-1, 1)))), xAt(math.Min(bu.To.Seconds(), float64(max(n-1, 1))))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#ff7f0e" fill-opacity="0.15"><title>burst %s</title></rect>`,
			x0, padT, math.Max(x1-x0, 1), plotH, template.HTMLEscapeString(bu.String()))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#b35900">%s %g×</text>`, x0+2, padT+10, template.HTMLEscapeString(bu.Tenant), bu.Factor)
	}
	step := tickStep(float64(n))
	for t := 0.0; t <= float64(n); t += step {
		x := xAt(t)
		if x > float64(padL+plotW)+0.5 {
			break
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/>`, x, padT+plotH, x, padT+plotH+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s s</text>`, x, padT+plotH+15, fmtNum(t))
	}
	pstep := max(1, (n+maxPointsPerLine-1)/maxPointsPerLine)
	for i, s := range ss {
		var pts strings.Builder
		for x := 0; x < len(s.Values); x += pstep {
			sum, k := 0.0, 0
			for j := x; j < min(x+pstep, len(s.Values)); j++ {
				sum += s.Values[j]
				k++
			}
			py := float64(padT+plotH) - float64(plotH)*(sum/float64(k))/ymax
			fmt.Fprintf(&pts, "%.1f,%.1f ", xAt(float64(x)), py)
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

// barChart draws grouped bars: one group per label, one bar per series,
// each bar with its value.
func barChart(title, yUnit string, labels []string, ss []series) template.HTML {
	ymax := 0.0
	for _, s := range ss {
		for _, v := range s.Values {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceMax(ymax)
	var b strings.Builder
	svgHead(&b, title, yUnit, ymax)
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
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="8" text-anchor="middle">%s</text>`,
				x0+barW*(float64(i)+0.5), float64(padT+plotH)-h-2, fmtNum(math.Round(v)))
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
<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em;overflow-x:auto;width:max-content;min-width:100%;box-sizing:border-box}
.wide{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:14px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child,td.of{text-align:left}td.best{font-weight:bold;background:#e6f4e6}tr.ref td{color:#555}
svg.chart{margin:4px;border:1px solid #ddd;max-width:100%;height:auto}section{margin-bottom:2em}</style></head>
<body><h1>Sluice replay</h1>
<p>Trace <code>{{.C.Trace}}</code>: {{.C.Rows}} requests, seed {{.C.Seed}}. Rates are weighted tokens per second
(prompt + output weight × output). Target is the weighted max-min fair share of what was admitted each second.{{range .C.Bursts}}
Burst {{.}} (shaded in the charts over time).{{end}}</p>
{{with .V}}<h2>Verdict</h2>
<p><strong>{{.Summary}}</strong>.</p>
<div class="wide"><table class="verdict"><tr><th>measure</th><th>of</th><th>better</th>{{range .Policies}}<th>{{.}}</th>{{end}}<th>best</th></tr>
{{range .Rows}}<tr{{if not .Better}} class="ref"{{end}}><td>{{.Name}}</td><td class="of">{{.Of}}</td><td>{{or .Better "not counted"}}</td>{{range .Cells}}<td{{if .Best}} class="best"{{end}}>{{.Text}}</td>{{end}}<td>{{.Winners}}</td></tr>
{{end}}</table></div>
<p>{{.Note}}</p>{{end}}
{{with .D}}<h2>Deferrable work</h2>
<p>{{.Summary}}</p>
<div class="wide"><table class="deferral"><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table></div>
{{range .Shares}}<p>{{.Policy}}: deferred work admitted while two tenants or more waited in the backlog for capacity</p>
<div class="wide"><table><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table></div>
{{end}}{{end}}
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

// htmlVerdict is the verdict as the HTML table shows it.
type htmlVerdict struct {
	*Verdict
	Rows []htmlMeasure
}

type htmlMeasure struct {
	Name, Of, Better, Winners string
	Cells                     []htmlCell
}

type htmlCell struct {
	Text string
	Best bool
}

func newHTMLVerdict(v *Verdict) *htmlVerdict {
	if v == nil {
		return nil
	}
	hv := &htmlVerdict{Verdict: v}
	for _, m := range slices.Concat(v.Measures, v.NotDeciding) {
		hm := htmlMeasure{Name: m.Name, Of: m.Of, Better: m.Better, Winners: strings.Join(m.Winners, ", ")}
		for i, t := range m.Text {
			hm.Cells = append(hm.Cells, htmlCell{Text: t, Best: slices.Contains(m.Winners, v.Policies[i])})
		}
		hv.Rows = append(hv.Rows, hm)
	}
	return hv
}

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
				{Name: fmt.Sprintf("floor %s", fmtNum(float64(t.Floor))), Color: palette[1], Dashed: true, Values: constant(float64(t.Floor), n)},
			}, c.Bursts)))
		}
		var wsr []series
		for j, t := range r.Tenants {
			wsr = append(wsr, series{Name: t.Name, Color: palette[j%len(palette)], Values: t.WaitMaxPerS})
		}
		title := r.Policy + ": longest queue wait per second"
		hp.Waits = add(title, lineChart(title, "ms", wsr, c.Bursts))
		var us []series
		for j, d := range r.Domains {
			us = append(us, series{Name: d.ID, Color: palette[j%len(palette)], Values: d.PrefillPerS})
		}
		title = r.Policy + ": prefill utilization per domain"
		hp.Util = add(title, lineChart(title, "busy share", us, c.Bursts))
		pl.P = append(pl.P, hp)
	}
	pl.Waits = add("queue wait p99 by tenant", barChart("queue wait p99 by tenant", "ms", labels, waits))
	pl.Floors = add("floor violations by tenant", barChart("floor violations by tenant", "s", labels, floors))
	return pl, nil
}

// WriteHTML writes c as one self-contained HTML page: the verdict, the
// tables, and
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
		V *htmlVerdict
		D *htmlDeferral
		*plots
	}{c, newHTMLVerdict(c.Verdict()), c.htmlDeferral(), pl})
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
