package embedded

// Restoring the broker's state at start: mochi reads clients, subscriptions,
// inflight and retained messages through the Stored* hooks, and fan-outs a
// crash interrupted are published again.

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.etcd.io/bbolt"
)

// replayFanouts re-publishes messages whose fan-out a crash interrupted.
// It runs once, after mochi restored sessions and before Acquire returns.
func (h *storeHook) replayFanouts(server *mqtt.Server) error {
	type pending struct {
		key []byte
		msg storage.Message
	}
	var todo []pending
	err := h.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketFanout).ForEach(func(k, v []byte) error {
			var m storage.Message
			if err := m.UnmarshalBinary(v); err != nil {
				return fmt.Errorf("fan-out record %x: %w", k, err)
			}
			todo = append(todo, pending{key: bytes.Clone(k), msg: m})
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("embedded broker: read interrupted publishes from %s: %w", h.db.Path(), err)
	}
	if len(todo) == 0 {
		return nil
	}
	inline, ok := server.Clients.Get(mqtt.InlineClientId)
	if !ok {
		return errors.New("embedded broker: inline client missing; cannot replay interrupted publishes")
	}
	for _, p := range todo {
		pk := p.msg.ToPacket()
		pk.FixedHeader.Type = packets.Publish
		pk.FixedHeader.Retain = false // the retained copy was stored with the record
		pk.FixedHeader.Dup = false
		pk.PacketID = 1 // mochi validates QoS>0 packets for a non-zero ID; inline publishes never use it
		if err := server.InjectPacket(inline, pk); err != nil {
			return fmt.Errorf("embedded broker: replay interrupted publish to %q: %w", pk.TopicName, err)
		}
		h.w.enqueue(change{bucket: bucketFanout, key: p.key})
	}
	if err := h.w.sync(); err != nil {
		return fmt.Errorf("embedded broker: commit replayed publishes to %s: %w", h.db.Path(), err)
	}
	h.Log.Info("embedded broker re-published messages interrupted by a crash", "count", len(todo))
	return nil
}

// Stored* are called by mochi's Serve to restore its state.

// StoredClients hands mochi the sessions with the intervals it is shown
// (see expiryHook).
func (h *storeHook) StoredClients() ([]storage.Client, error) {
	clients, err := readBucket[storage.Client](h.db, bucketClients)
	h.expiry.restored(clients)
	return clients, err
}

func (h *storeHook) StoredSubscriptions() ([]storage.Subscription, error) {
	return readBucket[storage.Subscription](h.db, bucketSubs)
}

func (h *storeHook) StoredInflightMessages() ([]storage.Message, error) {
	msgs, err := readBucket[storage.Message](h.db, bucketInflight)
	for _, m := range msgs {
		h.restoreOrder(m.Client, m.PacketID, m.Created)
	}
	return msgs, err
}

func (h *storeHook) StoredRetainedMessages() ([]storage.Message, error) {
	return readBucket[storage.Message](h.db, bucketRetained)
}

// StoredSysInfo restores the gauges mochi derives from stored state; the
// counters are not persisted (they would cost a write per second). mochi
// calls it last, when every message is loaded: their expiry starts here.
func (h *storeHook) StoredSysInfo() (storage.SystemInfo, error) {
	h.expiry.stampRestored()
	var info storage.SystemInfo
	err := h.db.View(func(tx *bbolt.Tx) error {
		info.Retained = int64(tx.Bucket(bucketRetained).Stats().KeyN)
		info.Inflight = int64(tx.Bucket(bucketInflight).Stats().KeyN)
		info.Subscriptions = int64(tx.Bucket(bucketSubs).Stats().KeyN)
		return nil
	})
	return info, err
}

// readBucket decodes every record of bucket (a mochi storage type).
func readBucket[T any, P interface {
	*T
	encoding.BinaryUnmarshaler
}](db *bbolt.DB, bucket []byte) ([]T, error) {
	var out []T
	err := db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			var rec T
			if err := P(&rec).UnmarshalBinary(v); err != nil {
				return fmt.Errorf("record %q: %w", k, err)
			}
			out = append(out, rec)
			return nil
		})
	})
	if err != nil {
		return out, fmt.Errorf("read bucket %s of %s: %w (the file is damaged; move it aside to start empty)", bucket, db.Path(), err)
	}
	return out, nil
}
