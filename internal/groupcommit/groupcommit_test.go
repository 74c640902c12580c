package groupcommit

import (
	"fmt"
	"testing"
	"time"
)

// Requests already waiting are committed together, at most max per group,
// in arrival order; Run returns when closing is closed.
func TestRunGroupsWaitingRequests(t *testing.T) {
	reqs := make(chan int, 10)
	for i := range 10 {
		reqs <- i
	}
	closing := make(chan struct{})
	groups := make(chan []int, 10)
	done := make(chan struct{})
	go func() {
		Run(reqs, closing, 4, func(g []int) { groups <- append([]int(nil), g...) })
		close(done)
	}()
	var got []string
	for range 3 {
		select {
		case g := <-groups:
			got = append(got, fmt.Sprint(g))
		case <-time.After(5 * time.Second):
			t.Fatalf("groups so far %v; the rest did not come within 5s", got)
		}
	}
	if want := "[[0 1 2 3] [4 5 6 7] [8 9]]"; fmt.Sprint(got) != want {
		t.Fatalf("groups %v, want %s", got, want)
	}
	// A lone request is committed at once, not held back for company.
	reqs <- 42
	select {
	case g := <-groups:
		if fmt.Sprint(g) != "[42]" {
			t.Fatalf("lone request committed as %v", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a lone request was not committed within 5s")
	}
	close(closing)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of closing")
	}
}

// With Linger, requests nobody waits for are held until one that waits
// arrives, and then share its commit; held alone, they are committed once
// Linger passes; closing commits what is held.
func TestLoopLingersForAWaiter(t *testing.T) {
	waits := func(r int) bool { return r < 0 } // negative: a caller waits
	run := func(linger time.Duration) (chan int, chan struct{}, chan []int, chan struct{}) {
		reqs, closing := make(chan int, 10), make(chan struct{})
		groups, done := make(chan []int, 10), make(chan struct{})
		go func() {
			Loop[int]{Max: 10, Linger: linger, Waits: waits}.Run(reqs, closing, func(g []int) { groups <- append([]int(nil), g...) })
			close(done)
		}()
		return reqs, closing, groups, done
	}
	next := func(groups chan []int, what string) []int {
		select {
		case g := <-groups:
			return g
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no group within 5s", what)
			return nil
		}
	}

	// A linger far longer than the test: only the waiter can end it.
	reqs, closing, groups, done := run(time.Hour)
	reqs <- 1
	reqs <- 2
	select {
	case g := <-groups:
		t.Fatalf("group %v committed before anyone waited", g)
	case <-time.After(50 * time.Millisecond):
	}
	reqs <- -3
	if g := next(groups, "after a waiter arrived"); fmt.Sprint(g) != "[1 2 -3]" {
		t.Fatalf("group %v, want [1 2 -3]", g)
	}
	// A waiter alone is committed at once; held requests at closing are
	// committed before Run returns.
	reqs <- -4
	if g := next(groups, "a lone waiter"); fmt.Sprint(g) != "[-4]" {
		t.Fatalf("group %v, want [-4]", g)
	}
	reqs <- 5
	time.Sleep(20 * time.Millisecond) // let the loop take 5 and start holding it
	close(closing)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of closing")
	}
	// 5 is committed, or, if the loop saw closing first, left in reqs.
	select {
	case g := <-groups:
		if fmt.Sprint(g) != "[5]" {
			t.Fatalf("group at closing %v, want [5]", g)
		}
	case r := <-reqs:
		if r != 5 {
			t.Fatalf("left in reqs %d, want 5", r)
		}
	default:
		t.Fatal("request 5 was neither committed nor left in reqs")
	}

	// A short linger ends by itself.
	reqs, closing, groups, _ = run(10 * time.Millisecond)
	defer close(closing)
	reqs <- 6
	if g := next(groups, "after the linger"); fmt.Sprint(g) != "[6]" {
		t.Fatalf("group %v, want [6]", g)
	}
}

func TestLoopDelaysAWaiterForCompany(t *testing.T) {
	waits := func(r int) bool { return r < 0 }
	reqs, closing := make(chan int, 10), make(chan struct{})
	groups := make(chan []int, 10)
	defer close(closing)
	// A delay far longer than the test: only a full group can end it.
	go Loop[int]{Max: 3, Delay: time.Hour, Waits: waits}.Run(reqs, closing, func(g []int) { groups <- append([]int(nil), g...) })
	reqs <- -1
	select {
	case g := <-groups:
		t.Fatalf("group %v committed before the delay passed or the group filled", g)
	case <-time.After(50 * time.Millisecond):
	}
	reqs <- -2
	reqs <- 3
	select {
	case g := <-groups:
		if fmt.Sprint(g) != "[-1 -2 3]" {
			t.Fatalf("group %v, want [-1 -2 3]", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a full group was not committed within 5s")
	}

	// A short delay ends by itself; a group nobody waits for is not delayed.
	reqs2, closing2 := make(chan int, 10), make(chan struct{})
	defer close(closing2)
	go Loop[int]{Max: 10, Delay: 20 * time.Millisecond, Waits: waits}.Run(reqs2, closing2, func(g []int) { groups <- append([]int(nil), g...) })
	reqs2 <- 4
	reqs2 <- -5
	select {
	case g := <-groups:
		if fmt.Sprint(g) != "[4]" && fmt.Sprint(g) != "[4 -5]" {
			t.Fatalf("group %v, want [4] or [4 -5]", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no group within 5s")
	}
}
