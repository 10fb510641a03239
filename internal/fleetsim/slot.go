package fleetsim

import "strings"

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// keyPrefix is the prefix redisstate puts in every key's hash tag by
// default ({sluice/t/acme}/rps), so that slots fall where a Cluster
// running sluiced would put them.
const keyPrefix = "sluice/"

// crcTable is CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0),
// the checksum Redis Cluster takes a key's slot from (crc16.c).
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// crc16 continues the checksum crc over s.
func crc16(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

// Slot is the Redis Cluster slot of a store key as redisstate writes it:
// the key's owner (everything up to its last '/': "t/acme" of
// "t/acme/rps") under the default prefix is the hash tag, so the slot is
// CRC16("sluice/t/acme") mod 16384 and all of an owner's keys share it.
func Slot(key string) int {
	owner := key
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		owner = key[:i]
	}
	return int(crc16(crc16(0, keyPrefix), owner) % Slots)
}

// shardOfSlot spreads the slots over n shards in n contiguous ranges of
// (nearly) equal size, as redis-cli --cluster create assigns them.
func shardOfSlot(slot, n int) int { return slot * n / Slots }
