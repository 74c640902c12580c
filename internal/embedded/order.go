package embedded

import (
	"cmp"
	"math"
	"slices"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Resend order. MQTT 3.1.1 §4.6.0-1 requires a resumed session to resend
// its unacknowledged PUBLISHes in the order they were first sent. mochi
// v2.7.9 resends Inflight.GetAll, which sorts by uint16(Created), Created
// being the publish time in whole seconds, with an unstable sort: messages
// of one second come back in any order, and ones straddling a multiple of
// 65536 s come back wrapped.
//
// The hook therefore numbers every message it sees queued to a session
// (nextOrder, increasing across all sessions) and keeps that number as
// Created in broker.db. Just before mochi resends a resumed session, in
// OnPacketEncode of its CONNACK, the hook rewrites Created of the session's
// inflight copies to 1..n in that order, which mochi's sort then keeps.
// Nothing else touches those copies at that point: the new client is not
// yet reading, and fanoutGate keeps publishes away until the resend is
// done. Created is otherwise only used for the server-wide maximum message
// expiry, which this broker switches off (see start).

// assignOrder returns the order number of an inflight packet of cl and
// records it. A first send (a PUBLISH without DUP) gets a new number; a
// resend or a QoS 2 PUBREL keeps the one its packet ID has.
func (h *storeHook) assignOrder(cl *mqtt.Client, pk packets.Packet) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	byID := h.order[cl.ID]
	if byID == nil {
		byID = map[uint16]uint64{}
		h.order[cl.ID] = byID
	}
	fresh := pk.FixedHeader.Type == packets.Publish && !pk.FixedHeader.Dup
	if n, ok := byID[pk.PacketID]; ok && !fresh {
		return n
	}
	n := h.nextOrder
	h.nextOrder++
	byID[pk.PacketID] = n
	return n
}

func (h *storeHook) dropOrder(id string, packetID uint16) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if byID := h.order[id]; byID != nil {
		delete(byID, packetID)
		if len(byID) == 0 {
			delete(h.order, id)
		}
	}
}

func (h *storeHook) forgetOrder(id string) {
	h.mu.Lock()
	delete(h.order, id)
	h.mu.Unlock()
}

// restoreOrder records the order numbers of inflight messages read from
// broker.db (files written before numbering hold the publish time there,
// which still orders them by second).
func (h *storeHook) restoreOrder(client string, packetID uint16, created int64) {
	n := uint64(max(created, 0))
	h.mu.Lock()
	defer h.mu.Unlock()
	byID := h.order[client]
	if byID == nil {
		byID = map[uint16]uint64{}
		h.order[client] = byID
	}
	byID[packetID] = n
	h.nextOrder = max(h.nextOrder, n+1)
}

// orderInflight rewrites Created of cl's inflight messages to 1..n in the
// order they were first sent, so mochi's resend keeps that order. Entries
// the hook never numbered (none are expected) go first.
func (h *storeHook) orderInflight(cl *mqtt.Client) {
	pks := cl.State.Inflight.GetAll(false)
	if len(pks) < 2 {
		return
	}
	if len(pks) > math.MaxUint16 {
		h.Log.Warn("embedded broker: more inflight messages than a 16-bit order holds; resend order may be wrong",
			"client", cl.ID, "count", len(pks))
	}
	h.mu.Lock()
	rank := make(map[uint16]uint64, len(pks))
	for id, n := range h.order[cl.ID] {
		rank[id] = n
	}
	h.mu.Unlock()
	slices.SortStableFunc(pks, func(a, b packets.Packet) int {
		return cmp.Or(cmp.Compare(rank[a.PacketID], rank[b.PacketID]), cmp.Compare(a.Created, b.Created),
			cmp.Compare(a.PacketID, b.PacketID))
	})
	for i, pk := range pks {
		pk.Created = int64(i + 1)
		cl.State.Inflight.Set(pk)
	}
}
