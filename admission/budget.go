package admission

import "time"

// budget is a tenant's cost budget: micro-USD spent in the current UTC day
// and month against its caps (0: no cap).
type budget struct {
	day, month           int64 // the periods spentDay and spentMon count: days and months since the epoch
	spentDay, spentMon   int64
	dailyCap, monthlyCap int64
}

// roll starts a new day or month of spending when the UTC date turns.
func (b *budget) roll(wall time.Time) {
	u := wall.UTC()
	day := u.Unix() / 86400
	if day == b.day {
		return
	}
	y, m, _ := u.Date()
	month := int64(y)*12 + int64(m)
	b.day, b.spentDay = day, 0
	if month != b.month {
		b.month, b.spentMon = month, 0
	}
}

// wait returns how long until price fits the budget (the next UTC day or
// month that resets the cap it breaks), or 0 when it fits now.
func (b *budget) wait(wall time.Time, price int64) time.Duration {
	var d time.Duration
	if b.dailyCap > 0 && b.spentDay+price > b.dailyCap {
		y, m, day := wall.UTC().Date()
		d = time.Date(y, m, day+1, 0, 0, 0, 0, time.UTC).Sub(wall)
	}
	if b.monthlyCap > 0 && b.spentMon+price > b.monthlyCap {
		y, m, _ := wall.UTC().Date()
		d = max(d, time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Sub(wall))
	}
	return d
}

// spend charges price to the current periods.
func (b *budget) spend(price int64) {
	b.spentDay += price
	b.spentMon += price
}

// adjust moves what was charged in (day, month) by delta, if that period is
// still current: a charge made yesterday is not refunded from today.
func (b *budget) adjust(day, month, delta int64) {
	if b.day == day {
		b.spentDay = max(b.spentDay+delta, 0)
	}
	if b.month == month {
		b.spentMon = max(b.spentMon+delta, 0)
	}
}

func usdToMicros(usd float64) int64 { return roundUnits(usd * 1e6) }
