package wfq

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios runs the scripts in testdata/. Commands:
//
//	new [max-per-flow=N] [max-total=N] [max-critical=N]
//	config [max-per-flow=N] [max-total=N] [max-critical=N]   (SetConfig)
//	enqueue                one item a line: ID TENANT/MODEL cost=C [weight=W] [critical]
//	dequeue [scan=N] [reject=(ID,...)]   the named items do not fit
//	remove ID
//	print                  bands, V, flows in head order with their items' tags
//
// Tags print in cost units (tag / TagUnit). Rewrite expected output with
// go test ./wfq/ -run TestScenarios -rewrite.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var q *Queue
		items := map[string]*Item{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "new", "config":
				var cfg Config
				d.MaybeScanArgs(t, "max-per-flow", &cfg.MaxPerFlow)
				d.MaybeScanArgs(t, "max-total", &cfg.MaxTotal)
				d.MaybeScanArgs(t, "max-critical", &cfg.MaxCritical)
				if d.Cmd == "new" {
					q, items = New(cfg), map[string]*Item{}
					return ""
				}
				q.SetConfig(cfg)
				return printQueue(q)
			case "enqueue":
				var out strings.Builder
				for line := range strings.SplitSeq(strings.TrimSpace(d.Input), "\n") {
					it := parseItem(t, line)
					id := it.Value.(string)
					if old := items[id]; old != nil && old.Queued() {
						it = old // enqueue the same item again (expect ErrQueued)
					}
					if err := q.Enqueue(it); err != nil {
						fmt.Fprintf(&out, "%s: %v\n", id, err)
						continue
					}
					items[id] = it
					fmt.Fprintf(&out, "%s: tag=%s\n", id, tagString(it.FinishTag()))
				}
				return out.String()
			case "dequeue":
				scan := 1
				d.MaybeScanArgs(t, "scan", &scan)
				var reject []string
				if d.HasArg("reject") {
					arg, _ := d.Arg("reject")
					reject = arg.Vals
				}
				var examined []string
				it := q.Dequeue(func(it *Item) bool {
					examined = append(examined, it.Value.(string))
					return !slices.Contains(reject, it.Value.(string))
				}, scan)
				served := "none"
				if it != nil {
					served = fmt.Sprintf("%s tag=%s", it.Value, tagString(it.FinishTag()))
				}
				if len(examined) == 0 {
					examined = []string{"nothing"}
				}
				return fmt.Sprintf("examined %s\nserved %s; V=%s Vcrit=%s\n", strings.Join(examined, " "),
					served, tagString(q.VirtualTime()), tagString(q.CriticalVirtualTime()))
			case "remove":
				id := d.CmdArgs[0].Key
				it := items[id]
				if it == nil || !q.Remove(it) {
					return id + " was not queued\n"
				}
				return "removed " + id + "\n"
			case "print":
				return printQueue(q)
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

func parseItem(t *testing.T, line string) *Item {
	f := strings.Fields(line)
	if len(f) < 3 {
		t.Fatalf("item %q: want ID TENANT/MODEL cost=C [weight=W] [critical]", line)
	}
	tenant, model, _ := strings.Cut(f[1], "/")
	it := &Item{Flow: FlowKey{tenant, model}, Weight: 1, Value: f[0]}
	for _, kv := range f[2:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "cost", "weight":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("item %q: %v", line, err)
			}
			if k == "cost" {
				it.Cost = n
			} else {
				it.Weight = n
			}
		case "critical":
			it.Critical = true
		default:
			t.Fatalf("item %q: unknown field %q", line, k)
		}
	}
	return it
}

func tagString(tag uint64) string {
	return strconv.FormatFloat(float64(tag)/float64(TagUnit), 'f', -1, 64)
}

// printQueue prints each band's flows in the order their heads will be
// served, each with its items front to back.
func printQueue(q *Queue) string {
	var b strings.Builder
	fmt.Fprintf(&b, "len=%d flows=%d\n", q.Len(), q.Flows())
	for _, band := range serveOrder {
		name := map[int]string{critical: "critical", normal: "normal"}[band]
		bd := &q.bands[band]
		fmt.Fprintf(&b, "%s: V=%s len=%d\n", name, tagString(bd.v), bd.n)
		lanes := slices.Clone(bd.heap.entries())
		slices.SortFunc(lanes, func(x, y entry) int {
			if x.less(&y) {
				return -1
			}
			return 1
		})
		for _, e := range lanes {
			l := &bd.lanes[e.id]
			fmt.Fprintf(&b, "  %s/%s:", l.flow.key.Tenant, l.flow.key.Model)
			for k := range l.n {
				it := l.at(k)
				fmt.Fprintf(&b, " %s(%s)", it.Value, tagString(it.tag))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
