package embedded

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
)

// CheckConfig checks cfg as mqttclient.Config.Validate does, with its
// embedded:// URLs checked here: one that can never start (a listener
// beyond loopback without users, a bad parameter) stops the process at
// start instead of failing every connection attempt.
func CheckConfig(cfg mqttclient.Config) error {
	cfg.URLs = slices.Clone(cfg.URLs)
	for i, raw := range cfg.URLs {
		if !IsEmbedded(raw) {
			continue
		}
		if _, err := ParseURL(raw); err != nil {
			return fmt.Errorf("urls: %w", err)
		}
		cfg.URLs[i] = "tcp://127.0.0.1:1883" // the form of a broker's ClientURL
	}
	return cfg.Validate()
}

// StartClient starts (or joins) the brokers cfg's embedded:// URLs name,
// then the client, dialling each broker's address in place of its URL.
// Closing the client releases the brokers: the client itself never starts
// or stops one. brokerOpts apply to the brokers (WithLog).
func StartClient(cfg mqttclient.Config, h mqttclient.Handlers, opts mqttclient.Options, brokerOpts ...Option) (mqttclient.Transport, error) {
	if err := CheckConfig(cfg); err != nil {
		return nil, err
	}
	var brokers []*Broker
	release := func() error {
		var errs []error
		for _, b := range brokers {
			if err := b.Release(); err != nil {
				errs = append(errs, fmt.Errorf("closing embedded broker %s: %w", b.Dir(), err))
			}
		}
		return errors.Join(errs...)
	}
	opts.ConfiguredURLs = cfg.URLs
	cfg.URLs = slices.Clone(cfg.URLs)
	for i, raw := range cfg.URLs {
		if !IsEmbedded(raw) {
			continue
		}
		b, err := Acquire(raw, brokerOpts...)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("start embedded broker %q: %w", raw, err), release())
		}
		brokers = append(brokers, b)
		cfg.URLs[i] = b.ClientURL()
	}
	c, err := mqttclient.Start(cfg, h, opts)
	if err != nil {
		return nil, errors.Join(err, release())
	}
	if len(brokers) == 0 {
		return c, nil
	}
	return &withBrokers{Transport: c, release: release}, nil
}

// withBrokers is a client and the brokers started beside it.
type withBrokers struct {
	mqttclient.Transport
	release func() error
}

// Close closes the client, then releases the brokers, even after the
// client's close timed out: its loop no longer needs them once closing,
// and a leaked reference would keep a broker running.
func (w *withBrokers) Close(ctx context.Context) error {
	err := w.Transport.Close(ctx)
	return errors.Join(err, w.release())
}
