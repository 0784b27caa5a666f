"""The ring protocol of the block-scaled MoE schedule (kernel/grouped_masked_scaled_ws.cuh), run as
a model on the CPU: a producer whose copies land at any later time, kGatherWarps warps that take
turns staging fills, and the consumers, over S slots whose full and empty mbarriers are waited on
by phase parity as the hardware does (try_wait.parity passes once the barrier's current phase has
the other parity). A parity wait cannot tell a phase from the one two laps before it, so the
schedule's claim is that no waiter ever falls two laps behind: with W turns and S slots, a warp's
previous fill (f - W) waited for the release of f - W - S, so every fill up to f - 2 S is released
when it waits for f - S, as long as W <= S (the kernel asserts W < S). The model checks what a
false pass would break: no fill's codes or scales are written into a slot before its previous
fill was consumed, and the consumers read each fill's own. Random schedules, biased towards slow
consumers; with W = S + 1 the model must find a broken schedule, which shows it can."""
from __future__ import annotations

import random


class Barrier:
    """An mbarrier: `count` arrivals complete a phase; try_wait.parity(p) passes when the phase
    with parity p has completed, i.e. when the current phase's parity is not p."""

    def __init__(self, count: int):
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.completed, self.pending = self.completed + 1, self.count

    def passes(self, parity: int) -> bool:
        return (self.completed & 1) != parity


def run(stages: int, turns: int, fills: int, rng: random.Random) -> list[str]:
    """One random schedule of `fills` fills; the protocol's violations (none when it holds)."""
    full = [Barrier(2) for _ in range(stages)]  # the producer's arrive.expect_tx and one warp's lanes
    empty = [Barrier(1) for _ in range(stages)]  # the consumers' release
    codes, scales = [None] * stages, [None] * stages  # the fill whose data a slot holds
    released: set[int] = set()
    errors: list[str] = []
    producer = 0  # next fill the producer issues
    in_flight: list[int] = []  # issued copies, landing in any order
    gathered = [w for w in range(turns)]  # each warp's next fill (its turn: f % turns == w)
    consumer = 0

    def may_write(f: int, what: str) -> None:
        if f >= stages and f - stages not in released:
            errors.append(f"{what} of fill {f} written before fill {f - stages} was consumed")

    def waits_empty(f: int) -> bool:
        slot, lap = f % stages, f // stages
        return lap == 0 or empty[slot].passes((lap + 1) & 1)

    while consumer < fills:
        moves = []
        if producer < fills and waits_empty(producer):
            moves.append(("produce", 1))
        if in_flight:
            moves.append(("land", 2))
        for w in range(turns):
            if gathered[w] < fills and waits_empty(gathered[w]):
                moves.append((("gather", w), 2))
        slot, lap = consumer % stages, consumer // stages
        if full[slot].passes(lap & 1):  # the consumers' ring parity: lap & 1 (its phase `lap` done)
            moves.append(("consume", 1))
        if not moves:
            errors.append(f"deadlock at fill {consumer}")
            break
        move = rng.choices([m for m, _ in moves], weights=[w for _, w in moves])[0]
        if move == "produce":
            in_flight.append(producer)
            producer += 1
        elif move == "land":
            f = in_flight.pop(rng.randrange(len(in_flight)))
            may_write(f, "codes")
            codes[f % stages] = f
            full[f % stages].arrive()
        elif move == "consume":
            if codes[slot] != consumer or scales[slot] != consumer:
                errors.append(f"fill {consumer} read codes of {codes[slot]} and scales of {scales[slot]}")
            released.add(consumer)
            empty[slot].arrive()
            consumer += 1
        else:
            w = move[1]
            f = gathered[w]
            may_write(f, "scales")
            scales[f % stages] = f
            full[f % stages].arrive()
            gathered[w] += turns
    return errors


def test_a_parity_wait_passes_once_its_phase_completed_and_two_laps_later_again():
    b = Barrier(1)
    assert not b.passes(0)  # phase 0 under way
    b.arrive()
    assert b.passes(0) and not b.passes(1)  # phase 0 done, phase 1 under way
    b.arrive()
    b.arrive()
    assert b.passes(0)  # phase 2 done: a wait for phase 0 cannot tell it from phase 2


def test_turns_up_to_the_slots_keep_every_fill_in_its_slot():
    rng = random.Random(55)
    for stages in range(2, 9):
        for turns in range(1, min(stages, 4) + 1):
            for _ in range(60):
                errors = run(stages, turns, fills=6 * stages + rng.randrange(stages), rng=rng)
                assert not errors, (stages, turns, errors[:3])


def test_more_turns_than_slots_break_the_parity_waits():
    rng = random.Random(7)
    for stages in (2, 3, 4):
        broken = sum(bool(run(stages, stages + 1, fills=8 * stages, rng=rng)) for _ in range(400))
        assert broken, f"{stages} slots, {stages + 1} turns: no schedule broke (the model lost its teeth)"
