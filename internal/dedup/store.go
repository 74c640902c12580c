package dedup

import (
	"context"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// Claim is one copy's hold on a key, in either store.
type Claim interface {
	Key() claims.Key
	// Commit records the key durably; nil means on disk (or in the table).
	Commit(ctx context.Context) error
	// Release gives the key up unless it was committed; only the call that
	// ends the claim returns true.
	Release() bool
	// Committed reports whether the key was recorded under this claim.
	Committed() bool
}

// Store is a ledger a Gate checks copies against: Bolt or SQL.
type Store interface {
	// Claim returns a claim with Pass, or the verdict without a claim.
	Claim(ctx context.Context, key claims.Key, hash [32]byte, wait time.Duration) (Claim, claims.Verdict, error)
	// Join, Skip and Refuse are the participants of a passed copy, of a
	// duplicate and of a failed copy (nil: the store joins no writer).
	Join(c Claim) *commit.Participant
	Skip(key claims.Key, hash [32]byte) *commit.Participant
	Refuse(cause error) *commit.Participant
	// Where names the store in errors.
	Where() string
	// NoHooks is the error for a copy without delivery hooks.
	NoHooks() error
}

// Bolt is the bbolt ledger as a Store. Its participants let a
// reliable_mqtt_out on the same file record the key with its record.
func Bolt(l *ledger.Ledger) Store { return boltStore{l} }

type boltStore struct{ l *ledger.Ledger }

func (s boltStore) Claim(ctx context.Context, key claims.Key, hash [32]byte, wait time.Duration) (Claim, claims.Verdict, error) {
	c, v, err := s.l.Claim(ctx, key, hash, wait)
	if c == nil { // no claim is a nil Claim, not an interface holding nil
		return nil, v, err
	}
	return c, v, err
}

// batchStore is a Store that records several claims in one transaction.
type batchStore interface {
	CommitAll(ctx context.Context, cs []Claim) []error
}

func (s boltStore) CommitAll(ctx context.Context, cs []Claim) []error {
	lcs := make([]*ledger.Claim, len(cs))
	for i, c := range cs {
		lcs[i] = c.(*ledger.Claim)
	}
	return s.l.CommitAll(ctx, lcs)
}

func (s boltStore) Join(c Claim) *commit.Participant {
	p := c.(*ledger.Claim).Participant()
	return &p
}

func (s boltStore) Skip(key claims.Key, hash [32]byte) *commit.Participant {
	p := s.l.SkipParticipant(key, hash)
	return &p
}

func (s boltStore) Refuse(cause error) *commit.Participant {
	p := s.l.RefuseParticipant(cause)
	return &p
}

func (s boltStore) Where() string  { return s.l.Path() }
func (s boltStore) NoHooks() error { return ErrNoCommitPath }

// SQL is an SQL ledger table as a Store (the mode without apply). It joins
// no writer: keys are recorded in their own transactions.
func SQL(p *sqlledger.Pool) Store { return sqlStore{p} }

type sqlStore struct{ p *sqlledger.Pool }

func (s sqlStore) Claim(ctx context.Context, key claims.Key, hash [32]byte, wait time.Duration) (Claim, claims.Verdict, error) {
	c, v, err := s.p.Claim(ctx, key, hash[:], wait)
	if err != nil {
		return nil, 0, fmt.Errorf("dedup_ledger: checking key %s: %w", key, err)
	}
	if c == nil {
		return nil, v, nil
	}
	return c, v, nil
}

func (sqlStore) Join(Claim) *commit.Participant                { return nil }
func (sqlStore) Skip(claims.Key, [32]byte) *commit.Participant { return nil }
func (sqlStore) Refuse(error) *commit.Participant              { return nil }
func (s sqlStore) Where() string                               { return "table " + s.p.Store().Table() }
func (sqlStore) NoHooks() error                                { return ErrNoHooksSQL }
