package embedded

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltwalk"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// storeFile is the broker's bbolt file inside its data directory.
const storeFile = "broker.db"

// schemaVersion is the store's format, written to the meta bucket; a file
// with another version is refused rather than misread (a newer one with a
// *format.NewerError).
const schemaVersion = "1"

// Buckets of broker.db. Keys that belong to a client start with
// clientPrefix(id), so one prefix scan finds (or deletes) a whole session.
var (
	bucketMeta     = []byte("meta")          // "schema" -> schemaVersion
	bucketClients  = []byte("clients")       // client ID -> storage.Client JSON
	bucketSubs     = []byte("subscriptions") // clientPrefix + filter -> storage.Subscription JSON
	bucketInflight = []byte("inflight")      // clientPrefix + packet ID (2 bytes BE) -> storage.Message JSON
	bucketRetained = []byte("retained")      // topic -> storage.Message JSON
	bucketFanout   = []byte("fanout")        // sequence (8 bytes BE) -> storage.Message JSON
	allBuckets     = [][]byte{bucketMeta, bucketClients, bucketSubs, bucketInflight, bucketRetained, bucketFanout}
)

const (
	openTimeout = 2 * time.Second  // bbolt file lock: another process holds the dir
	syncTimeout = 30 * time.Second // a commit a publisher waits for before we give up on it
)

// storeHook is a mochi storage hook that keeps the broker's state in bbolt.
//
// mochi's own bolt hook loses the packet IDs of inflight messages, so a
// restored session reports "present" and delivers nothing. This hook stores
// every inflight message under its client and packet ID, and restores it
// with that ID.
//
// It also closes a window mochi leaves open: mochi PUBACKs a publisher
// before it fans the message out to subscribers, so a crash in between
// loses a message the publisher believes delivered. Every QoS>0 publish is
// therefore first written as a fan-out record; the record is deleted after
// mochi has queued the message for all subscribers, and records left by a
// crash are re-published when the broker starts (at-least-once).
//
// It also makes session takeover and resend safe (see fanoutGate and
// orderInflight): mochi loses messages published while a stored session is
// resumed, and resends in an order MQTT forbids.
//
// Writes go through one committer (see writer) in the order the hooks run,
// so a committed state is always a prefix of the events. Invariant, enforced
// in OnQosPublish: a PUBACK/PUBREC is written to a publisher only after
// its fan-out record (and retained copy) is committed.
type storeHook struct {
	mqtt.HookBase
	server *mqtt.Server // set before AddHook; used to find the session a CONNECT resumes
	expiry *expiryHook  // set before AddHook; owns the session expiry intervals
	db     *bbolt.DB
	w      *writer
	gate   *fanoutGate

	mu        sync.Mutex                   // guards the fields below
	fanouts   map[*mqtt.Client]uint64      // client -> fan-out record of the publish it is processing
	nextSeq   uint64                       // next fan-out record key
	gated     map[*mqtt.Client]int         // client -> its fan-outs inside gate (inline client: several)
	takeovers map[string]*takeover         // client ID -> takeover in progress
	order     map[string]map[uint16]uint64 // client ID -> packet ID -> order of its inflight message
	nextOrder uint64                       // next order number (see order.go)

	closeMu sync.Mutex
	stopErr error
}

func (h *storeHook) ID() string { return "reliable-mqtt-bbolt-store" }

func (h *storeHook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablish,
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
		mqtt.OnPacketEncode,
		mqtt.OnSubscribed,
		mqtt.OnUnsubscribed,
		mqtt.OnPublish,
		mqtt.OnPublished,
		mqtt.OnPublishDropped,
		mqtt.OnRetainMessage,
		mqtt.OnRetainedExpired,
		mqtt.OnWillSent,
		mqtt.OnQosPublish,
		mqtt.OnQosComplete,
		mqtt.OnQosDropped,
		mqtt.OnClientExpired,
		mqtt.StoredClients,
		mqtt.StoredSubscriptions,
		mqtt.StoredInflightMessages,
		mqtt.StoredRetainedMessages,
		mqtt.StoredSysInfo,
	}, []byte{b})
}

// Init opens (creating if needed) the bbolt file whose path is config.
func (h *storeHook) Init(config any) error {
	path, ok := config.(string)
	if !ok || path == "" {
		return mqtt.ErrInvalidConfigType
	}
	// No freelist is written at each commit (one page less per fsync: flash
	// wear, docs/operations.md), so bbolt rebuilds it at every open by
	// walking the whole tree on a goroutine of its own, where a damaged
	// page crashes the process: checkTree walks it safely first.
	err := checkTree(path)
	var db *bbolt.DB
	if err == nil {
		db, err = bbolt.Open(path, 0o600, &bbolt.Options{Timeout: openTimeout, NoFreelistSync: true})
	}
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("open broker store %s: file is locked, another process is running a broker on this dir; "+
				"stop it or choose another ?dir=", path)
		}
		return fmt.Errorf("open broker store %s: %w", path, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch v := meta.Get([]byte("schema")); {
		case v == nil:
			if err := meta.Put([]byte("schema"), []byte(schemaVersion)); err != nil {
				return err
			}
		case string(v) != schemaVersion:
			if n, err := strconv.ParseUint(string(v), 10, 64); err == nil {
				if err := format.Check(path, "the embedded broker's store", n, 1); err != nil {
					return err
				}
			}
			return fmt.Errorf("schema version %q, this build reads %q; use a data directory written by this version", v, schemaVersion)
		}
		if k, _ := tx.Bucket(bucketFanout).Cursor().Last(); k != nil {
			h.nextSeq = binary.BigEndian.Uint64(k) + 1
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return fmt.Errorf("open broker store %s: %w", path, err)
	}
	// bbolt fsyncs the file, never the directory that names it: a new
	// broker.db (or data directory) could vanish in a power cut with every
	// session and message the broker acknowledged since.
	if err := syncDirs(filepath.Dir(path)); err != nil {
		_ = db.Close()
		return fmt.Errorf("open broker store %s: sync its directory: %w", path, err)
	}
	h.db = db
	h.fanouts = map[*mqtt.Client]uint64{}
	h.gated = map[*mqtt.Client]int{}
	h.takeovers = map[string]*takeover{}
	h.order = map[string]map[uint16]uint64{}
	h.nextOrder = 1
	h.gate = newFanoutGate()
	h.w = newWriter(db, h.Log)
	return nil
}

// checkTree walks the tree of an existing store read-only with boltwalk,
// which refuses a damaged page with an error where bbolt's own walk would
// crash. A file locked by another process fails as bbolt's open does.
func checkTree(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: openTimeout, ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		pageSize := int64(tx.DB().Info().PageSize)
		err := boltwalk.Walk(path, pageSize, uint64(tx.Size()/pageSize), uint64(tx.Cursor().Bucket().RootPage()))
		if _, ok := errors.AsType[*boltwalk.Damage](err); ok {
			return fmt.Errorf("the file is damaged (%w); refusing to use it: stop the process, move the file aside "+
				"(mv %s %s.damaged) and start with a new store, or restore it from a backup", err, path, path)
		}
		return err
	})
}

// Stop commits what is queued and closes the file. mochi calls it after all
// clients are gone.
func (h *storeHook) Stop() error {
	if h.db == nil {
		return nil
	}
	h.gate.close()
	err := errors.Join(h.w.close(), h.db.Close())
	if err != nil {
		err = fmt.Errorf("close broker store %s: %w", h.db.Path(), err)
	}
	h.closeMu.Lock()
	h.stopErr = err
	h.closeMu.Unlock()
	h.db = nil
	return err
}

func (h *storeHook) closeErr() error {
	h.closeMu.Lock()
	defer h.closeMu.Unlock()
	return h.stopErr
}

// sessionEnds reports whether a client's session ends with its connection
// (MQTT 3 clean session, MQTT 5 session expiry 0); such sessions are not stored.
func sessionEnds(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval == 0
	}
	return cl.Properties.Clean
}

// OnSessionEstablish runs before mochi looks for a stored session to
// resume; resuming one is a takeover (see fanoutGate).
func (h *storeHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if !sessionEnds(cl) {
		h.beginTakeover(cl)
	}
}

// OnSessionEstablished runs after the CONNACK and the resend of a resumed
// session: its takeover is complete.
func (h *storeHook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	defer h.finishTakeover(cl)
	if sessionEnds(cl) {
		// A clean start discards any session stored under this ID.
		h.forget(cl.ID)
		return
	}
	h.w.enqueue(h.clientRecord(cl))
}

// OnPacketEncode orders a resumed session's inflight messages just before
// mochi resends them; the CONNACK is the last packet written before that.
func (h *storeHook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack && pk.SessionPresent {
		h.orderInflight(cl)
	}
	return pk
}

func (h *storeHook) OnWillSent(cl *mqtt.Client, _ packets.Packet) {
	if !sessionEnds(cl) {
		h.w.enqueue(h.clientRecord(cl))
	}
}

func (h *storeHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	h.mu.Lock()
	seq, publishing := h.fanouts[cl]
	delete(h.fanouts, cl)
	gated := h.gated[cl]
	delete(h.gated, cl)
	h.mu.Unlock()
	for range gated {
		h.gate.leave() // its publish ended without OnPublished
	}
	if publishing {
		// The connection died between OnPublish and the fan-out: the
		// publisher got no PUBACK and will resend, so the record goes.
		h.w.enqueue(change{bucket: bucketFanout, key: seqKey(seq)})
	}
	if !expire || errors.Is(cl.StopCause(), packets.ErrSessionTakenOver) {
		return // a taken-over session lives on under the new connection
	}
	h.forget(cl.ID)
}

func (h *storeHook) OnClientExpired(cl *mqtt.Client) {
	h.forget(cl.ID)
}

// forget deletes a session from the file and from the resend order.
func (h *storeHook) forget(id string) {
	h.forgetOrder(id)
	h.w.enqueue(forgetClient(id)...)
}

func (h *storeHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if sessionEnds(cl) {
		return
	}
	var cs []change
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || reasonCodes[i] > 2 {
			continue // refused filter
		}
		sub := storage.Subscription{
			T:                 storage.SubscriptionKey,
			ID:                cl.ID + ":" + f.Filter,
			Client:            cl.ID,
			Filter:            f.Filter,
			Identifier:        f.Identifier,
			RetainHandling:    f.RetainHandling,
			Qos:               reasonCodes[i],
			RetainAsPublished: f.RetainAsPublished,
			NoLocal:           f.NoLocal,
		}
		cs = append(cs, h.put(bucketSubs, subKey(cl.ID, f.Filter), sub))
	}
	// The SUBACK follows this hook: make the subscription durable first, so
	// messages published while the client is away are queued after a crash.
	if err := h.w.sync(cs...); err != nil {
		h.failClient(cl, "store subscription", err)
	}
}

func (h *storeHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	cs := make([]change, 0, len(pk.Filters))
	for _, f := range pk.Filters {
		cs = append(cs, change{bucket: bucketSubs, key: subKey(cl.ID, f.Filter)})
	}
	h.w.enqueue(cs...)
}

// OnPublish lets every QoS>0 publish pass fanoutGate, and records a
// fan-out record for one from a client.
func (h *storeHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Qos == 0 {
		return pk, nil // QoS 0 promises nothing and is never queued
	}
	h.gate.enter() // left in OnPublished, or OnDisconnect if mochi stops before
	h.mu.Lock()
	h.gated[cl]++
	h.mu.Unlock()
	if cl.Net.Inline {
		return pk, nil // inline publishes are our own replays
	}
	msg := toMessage(pk)
	msg.T = "FAN"
	msg.Client = cl.ID
	h.mu.Lock()
	seq := h.nextSeq
	h.nextSeq++
	h.fanouts[cl] = seq
	h.mu.Unlock()
	h.w.enqueue(h.put(bucketFanout, seqKey(seq), msg))
	return pk, nil
}

// OnPublished runs after mochi queued the message for every subscriber;
// their inflight records precede this delete in the write order.
func (h *storeHook) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	h.mu.Lock()
	seq, ok := h.fanouts[cl]
	delete(h.fanouts, cl)
	gated := pk.FixedHeader.Qos > 0 && h.gated[cl] > 0
	if gated {
		h.gated[cl]--
		if h.gated[cl] == 0 {
			delete(h.gated, cl)
		}
	}
	h.mu.Unlock()
	if gated {
		h.gate.leave()
	}
	if ok {
		h.w.enqueue(change{bucket: bucketFanout, key: seqKey(seq)})
	}
}

func (h *storeHook) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	h.Log.Warn("embedded broker dropped a message: client's pending writes are full (raise max_queued)",
		"client", cl.ID, "topic", pk.TopicName)
}

func (h *storeHook) OnRetainMessage(_ *mqtt.Client, pk packets.Packet, _ int64) {
	if len(pk.Payload) == 0 {
		h.w.enqueue(change{bucket: bucketRetained, key: []byte(pk.TopicName)})
		return
	}
	msg := toMessage(pk)
	msg.T = storage.RetainedKey
	h.w.enqueue(h.put(bucketRetained, []byte(pk.TopicName), msg))
}

func (h *storeHook) OnRetainedExpired(topic string) {
	h.w.enqueue(change{bucket: bucketRetained, key: []byte(topic)})
}

// OnQosPublish stores an inflight packet under its client and packet ID.
// For an acknowledgement to a publisher (PUBACK, PUBREC) it is also the last
// moment before mochi writes that acknowledgement, so it waits here until
// everything this publish queued is committed.
func (h *storeHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	var cs []change
	if !sessionEnds(cl) && pk.FixedHeader.Type != packets.Puback {
		msg := toMessage(pk)
		msg.T = storage.InflightKey
		msg.Client = cl.ID
		msg.Created = int64(h.assignOrder(cl, pk)) // see order.go
		cs = append(cs, h.put(bucketInflight, inflightKey(cl.ID, pk.PacketID), msg))
	}
	switch pk.FixedHeader.Type {
	case packets.Puback, packets.Pubrec:
		if err := h.w.sync(cs...); err != nil {
			h.failClient(cl, "store publish", err)
		}
	default:
		h.w.enqueue(cs...)
	}
}

func (h *storeHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	h.dropOrder(cl.ID, pk.PacketID)
	h.w.enqueue(change{bucket: bucketInflight, key: inflightKey(cl.ID, pk.PacketID)})
}

// OnQosDropped deletes a dropped inflight message, except when mochi clears
// a taken-over client: its messages were cloned to the new connection under
// the same client ID and packet IDs, so the records still hold.
func (h *storeHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	h.dropOrder(cl.ID, pk.PacketID)
	h.w.enqueue(change{bucket: bucketInflight, key: inflightKey(cl.ID, pk.PacketID)})
}

// failClient closes a client whose state could not be made durable: mochi
// then fails to write the pending acknowledgement, and the client retries
// after reconnecting instead of believing something was stored.
func (h *storeHook) failClient(cl *mqtt.Client, what string, err error) {
	h.Log.Error("embedded broker: "+what+" failed; closing the client so it retries", "client", cl.ID, "error", err)
	cl.Stop(fmt.Errorf("embedded broker store: %w", err))
}

func (h *storeHook) clientRecord(cl *mqtt.Client) change {
	p := cl.Properties.Props
	c := storage.Client{
		ID:              cl.ID,
		T:               storage.ClientKey,
		Remote:          cl.Net.Remote,
		Listener:        cl.Net.Listener,
		Username:        cl.Properties.Username,
		Clean:           cl.Properties.Clean,
		ProtocolVersion: cl.Properties.ProtocolVersion,
		Properties: storage.ClientProperties{
			AuthenticationData:        p.AuthenticationData,
			User:                      p.User,
			AuthenticationMethod:      p.AuthenticationMethod,
			SessionExpiryInterval:     h.expiry.asked(cl.ID, p.SessionExpiryInterval),
			SessionExpiryIntervalFlag: p.SessionExpiryIntervalFlag,
			MaximumPacketSize:         p.MaximumPacketSize,
			ReceiveMaximum:            p.ReceiveMaximum,
			TopicAliasMaximum:         p.TopicAliasMaximum,
			RequestProblemInfo:        p.RequestProblemInfo,
			RequestProblemInfoFlag:    p.RequestProblemInfoFlag,
			RequestResponseInfo:       p.RequestResponseInfo,
		},
		Will: storage.ClientWill(cl.Properties.Will),
	}
	return h.put(bucketClients, []byte(cl.ID), c)
}

// put encodes v; the storage types cannot fail to encode, and if one ever
// does the error is logged and the record skipped rather than half-written.
func (h *storeHook) put(bucket, key []byte, v encoding.BinaryMarshaler) change {
	data, err := v.MarshalBinary()
	if err != nil {
		h.Log.Error("embedded broker: encode record", "bucket", string(bucket), "key", string(key), "error", err)
		return change{}
	}
	return change{bucket: bucket, key: key, value: data}
}

// toMessage keeps everything a publish needs to be sent again, including
// its packet ID (mochi's bolt hook drops it).
func toMessage(pk packets.Packet) storage.Message {
	p := pk.Properties
	return storage.Message{
		Payload:     pk.Payload,
		Origin:      pk.Origin,
		TopicName:   pk.TopicName,
		FixedHeader: pk.FixedHeader,
		Created:     pk.Created,
		PacketID:    pk.PacketID,
		Properties: storage.MessageProperties{
			CorrelationData:        p.CorrelationData,
			SubscriptionIdentifier: p.SubscriptionIdentifier,
			User:                   p.User,
			ContentType:            p.ContentType,
			ResponseTopic:          p.ResponseTopic,
			MessageExpiryInterval:  p.MessageExpiryInterval,
			TopicAlias:             p.TopicAlias,
			PayloadFormat:          p.PayloadFormat,
			PayloadFormatFlag:      p.PayloadFormatFlag,
		},
	}
}

// clientPrefix is a 2-byte length followed by the ID, so no client's keys
// are a prefix of another client's.
func clientPrefix(id string) []byte {
	b := make([]byte, 2, 2+len(id))
	binary.BigEndian.PutUint16(b, uint16(len(id)))
	return append(b, id...)
}

func subKey(id, filter string) []byte { return append(clientPrefix(id), filter...) }

func inflightKey(id string, packetID uint16) []byte {
	return binary.BigEndian.AppendUint16(clientPrefix(id), packetID)
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// forgetClient deletes a session: its record, subscriptions and inflight messages.
func forgetClient(id string) []change {
	return []change{
		{bucket: bucketClients, key: []byte(id)},
		{bucket: bucketSubs, key: clientPrefix(id), prefix: true},
		{bucket: bucketInflight, key: clientPrefix(id), prefix: true},
	}
}

// syncDirs fsyncs dir and its parent, which holds dir's own entry (the
// data directory may just have been created).
func syncDirs(dir string) error {
	for _, d := range []string{dir, filepath.Dir(dir)} {
		f, err := os.Open(d)
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
