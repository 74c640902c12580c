// Package sqlargs turns a Benthos args_mapping result into database/sql
// arguments, for every component that runs SQL with them (dedup_ledger's
// apply statements, sql_query).
package sqlargs

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// For prepares mapping for one batch (nil when there is none): an executor
// built once per batch, not once per message.
func For(batch service.MessageBatch, mapping *bloblang.Executor) *service.MessageBatchBloblangExecutor {
	if mapping == nil {
		return nil
	}
	return batch.BloblangExecutor(mapping)
}

// Of runs exec on message i of its batch; its result must be an array of
// scalars. JSON numbers become int64 or float64 (a driver would send
// Benthos's json.Number as text); objects and arrays are refused.
func Of(exec *service.MessageBatchBloblangExecutor, i int) ([]any, error) {
	res, err := exec.Query(i)
	if err != nil {
		return nil, err
	}
	if res == nil {
		return nil, errors.New("the mapping deleted the message; it must return an array of arguments")
	}
	v, err := res.AsStructured()
	if err != nil {
		return nil, fmt.Errorf("reading its result: %w", err)
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("the result must be an array of arguments, got %T", v)
	}
	for k, a := range arr {
		switch x := a.(type) {
		case json.Number:
			if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
				arr[k] = n
			} else if f, err := strconv.ParseFloat(string(x), 64); err == nil {
				arr[k] = f
			} else {
				return nil, fmt.Errorf("argument %d: number %q out of range", k, x)
			}
		case map[string]any, []any:
			return nil, fmt.Errorf("argument %d is %T: a database argument must be a string, number, bool, bytes, timestamp or null; encode it first, e.g. with .format_json()", k, a)
		}
	}
	return arr, nil
}
