"""Holds: requests that may have been billed, held against every scope until their bills are
known. The book's rule, the keeper that finds the bills, and the property that no order of
admissions, answers, hidden bills and kills takes any scope past its cap."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from regen.config import DatasetConfig
from regen.conversation import Charge, Usage
from regen.engine.budget import BudgetBook, Denial, Lease, Prices, fill_cost
from regen.engine.holds import HoldKeeper, HoldSummary
from regen.state.outstanding import Sent
from regen.state.work import DatasetProgress

PRICES = Prices(0.5e-6, 2.0e-6)


def progress(name: str) -> DatasetProgress:
    return DatasetProgress(name, 0, 0, 0, 0, 100, 0, 0, 0, 0, 0.0)


def two_datasets(**limits: float | int | None) -> BudgetBook:
    job_cap = limits.pop("job_cap", None)
    a = DatasetConfig(name="a", path="x", **limits)  # type: ignore[arg-type]
    b = DatasetConfig(name="b", path="x")
    return BudgetBook(
        [a, b],
        [progress("a"), progress("b")],
        job_max_cost_usd=job_cap,  # type: ignore[arg-type]
    )


def admit(book: BudgetBook, dataset: str = "a", max_tokens: int = 1000) -> Lease | Denial:
    return book.admit(
        dataset,
        "lane",
        max_tokens=max_tokens,
        prompt_tokens_est=50,
        prompt_tokens_bound=lambda: 100,
        prices=PRICES,
    )


def test_a_killed_runs_request_holds_its_dataset_cap_until_its_bill_is_known() -> None:
    """A dataset's cap was only held for the job: a killed run's requests took a $1.50 cap to
    $3.74. Each is held against its dataset too, and released by its bill."""
    book = two_datasets(max_cost_usd=0.005)
    worst = PRICES.cost(100, 1000)  # 0.00205
    book.add_hold("a", worst, 1000, awaited=True)
    book.add_hold("a", worst, 1000, awaited=True)
    denial = admit(book)
    assert denial == Denial(
        "dollar cap held for requests whose bills are not known yet", wait=True, dataset=True
    )
    assert isinstance(admit(book, "b"), Lease)  # the other dataset has no cap
    book.release("a", worst, 1000, fill_cost(Usage(100, 400), PRICES), awaited=True)  # less
    assert isinstance(admit(book), Lease)
    assert book.datasets["a"].scope.spent_usd == PRICES.cost(100, 400)


def test_a_killed_runs_request_holds_the_token_budget_and_its_tokens_count() -> None:
    book = two_datasets(token_budget=3000)
    book.add_hold("a", 0.0, 1000, awaited=True)
    book.add_hold("a", 0.0, 1000, awaited=True)
    assert isinstance(admit(book), Lease)  # 2000 held + 1000 reserved
    assert admit(book) == Denial("token budget held by requests in flight", wait=True, dataset=True)
    book.release("a", 0.0, 1000, Usage(0, 1600), awaited=True)  # a long answer: it counts
    book.release("a", 0.0, 1000, None, awaited=True)  # not billed
    assert book.datasets["a"].scope.spent_tokens == 1600
    assert book.left("a")[0] == 3000 - 1600 - 1000


def test_a_cap_that_no_release_can_free_is_met_at_once() -> None:
    """Spent plus the next request's worst case over the cap: no outcome of what is in flight
    or held makes room (the spend only grows), so the budget is met, not waited for."""
    book = two_datasets(max_cost_usd=0.003)
    book.add_hold("a", 0.002, 0)
    book._spend("a", Usage(0, 0, 0, 0.001))
    assert admit(book).reason == "dollar cap met"  # type: ignore[union-attr]


def test_holds_of_a_dataset_no_longer_in_the_job_hold_the_job() -> None:
    book = two_datasets(job_cap=0.004)
    book.add_hold("gone", 0.003, 100, awaited=True)
    assert book.job.held_usd == 0.003
    assert admit(book).wait  # type: ignore[union-attr]


def test_holds_whose_bills_come_only_at_their_deadline_end_the_run_rather_than_idle() -> None:
    """A held request whose generation id regen never saw is released no sooner than a lane
    timeout (an hour on a long lane). When only such holds stand between a scope and its cap,
    with nothing in flight, the budget is met for this run, saying so, instead of idling;
    and every scope says it in the same words (issue 46: a dataset's token budget said "met",
    exit 0, where the job's cap said "run again later", exit 4)."""
    book = two_datasets(max_cost_usd=0.003)
    book.add_hold("a", 0.002, 100)  # no generation id
    denied = admit(book)
    assert isinstance(denied, Denial) and not denied.wait and book.datasets["a"].held_out
    held = "held for 1 requests whose bills cannot be seen yet: run again later"
    assert denied.reason.startswith("its dollar cap is met") and held in denied.reason
    tokens = two_datasets(token_budget=150)
    tokens.add_hold("a", 0.002, 200)
    denied = admit(tokens)
    assert isinstance(denied, Denial) and tokens.datasets["a"].held_out
    assert denied.reason.startswith("its token budget is met (0 of 150") and held in denied.reason
    job = two_datasets(job_cap=0.003)
    job.add_hold("a", 0.002, 100)
    denial = job.admit(
        "b",
        "lane",
        max_tokens=1000,
        prompt_tokens_est=50,
        prompt_tokens_bound=lambda: 100,
        prices=PRICES,
    )
    assert isinstance(denial, Denial) and denial.stops_run
    assert "up to $0.0020 and 100 tokens " + held in denial.reason
    # One whose bill is looked up by its generation id comes within seconds: it is waited for.
    waits = two_datasets(max_cost_usd=0.003)
    waits.add_hold("a", 0.002, 100, awaited=True)
    assert admit(waits).wait  # type: ignore[union-attr]


@settings(max_examples=300, deadline=None)
@given(
    cap=st.floats(0.002, 0.03),
    job_cap=st.floats(0.003, 0.05),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["send", "answer", "cut", "kill", "bill"]),
            st.integers(1, 3000),
            st.floats(0, 1),
            st.booleans(),
        ),
        max_size=200,
    ),
)
def test_no_order_of_answers_hidden_bills_and_kills_passes_any_cap(
    cap: float, job_cap: float, steps: list[tuple[str, int, float, bool]]
) -> None:
    """Every scope stays within its cap, whatever the provider bills and whenever: answers
    seen, attempts cut short (held until their bill shows), and kills, after which a new
    book (the next run) holds what the dead one had out."""

    def new_book() -> BudgetBook:
        return two_datasets(max_cost_usd=cap, job_cap=job_cap)

    book = new_book()
    billed = {"a": 0.0, "b": 0.0}
    in_flight: list[tuple[Lease, float]] = []
    held: list[tuple[str, float, float, float]] = []  # dataset, worst, tokens, what it costs

    def total() -> float:
        return billed["a"] + billed["b"]

    for action, max_tokens, share, other in steps:
        ds = "b" if other else "a"
        if action == "send" or not (in_flight or held):
            lease = admit(book, ds, max_tokens)
            if isinstance(lease, Lease):
                in_flight.append((lease, share))
        elif action == "answer" and in_flight:
            lease, sh = in_flight.pop(0)
            usage = fill_cost(Usage(100, int(sh * lease.max_tokens)), PRICES)
            billed[lease.dataset] += usage.cost_usd or 0.0
            book.settle(lease, usage)
        elif action == "cut" and in_flight:
            lease, sh = in_flight.pop(0)
            cost = PRICES.cost(100, int(sh * lease.max_tokens))
            billed[lease.dataset] += cost  # billed now; regen learns it later
            book.hold(lease)
            held.append((lease.dataset, lease.worst_usd, lease.tokens, cost))
        elif action == "bill" and held:
            ds_, worst, tokens, cost = held.pop(0)
            book.release(ds_, worst, tokens, Usage(0, 0, 0, cost) if cost else None)
        elif action == "kill":
            # What was in flight is billed by the provider after the client is gone; the next
            # run holds it (and what was already held) until the bills are found.
            for lease, sh in in_flight:
                cost = PRICES.cost(100, int(sh * lease.max_tokens))
                billed[lease.dataset] += cost
                held.append((lease.dataset, lease.worst_usd, lease.tokens, cost))
            in_flight = []
            spent_a, spent_b = (
                book.datasets["a"].scope.spent_usd,
                book.datasets["b"].scope.spent_usd,
            )
            book = new_book()
            book._spend("a", Usage(0, 0, 0, spent_a))
            book._spend("b", Usage(0, 0, 0, spent_b))
            for ds_, worst, tokens, _ in held:
                book.add_hold(ds_, worst, tokens)
        assert billed["a"] <= cap + 1e-12
        assert total() <= job_cap + 1e-12


class FakeGenerations:
    """`/generation?id=`: a record for each id once it is billed."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, object]] = {}
        self.asked: list[str] = []

    async def get_json(self, path: str) -> object:
        gen = path.split("id=", 1)[1]
        self.asked.append(gen)
        record = self.records.get(gen)
        return None if record is None else {"data": record}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def keeper_for(
    book: BudgetBook, unexplained: float | None = 0.0
) -> tuple[HoldKeeper, FakeGenerations, list[tuple[Charge | None, int]], Clock]:
    gens = FakeGenerations()
    settled: list[tuple[Charge | None, int]] = []
    clock = Clock()

    async def spend() -> dict[str, float]:
        return {} if unexplained is None else {"acct": unexplained}

    keeper = HoldKeeper(
        book,
        lookup={"or": gens},
        prices={"or": PRICES},
        account_of={"or": "acct"},
        unexplained=spend,
        settle=lambda charge, key: settled.append((charge, key)),
        flush=lambda: None,
        clock=clock,
        sleep=clock.sleep,
    )
    return keeper, gens, settled, clock


def sent(key: int, gen: str | None, endpoint: str = "or", deadline: float = 1100.0) -> Sent:
    return Sent(key, 1, f"item{key}", "a", "lane", endpoint, 0.002, 500.0, 990.0, deadline, gen)


async def test_the_keeper_finds_each_bill_by_its_generation_id_and_counts_it_in_its_place() -> None:
    book = two_datasets(max_cost_usd=0.01)
    keeper, gens, settled, clock = keeper_for(book)
    held = keeper.load([sent(1, "gen-1"), sent(2, "gen-2")], lambda ep: True)
    assert held == 2 and book.datasets["a"].scope.held_usd == 0.004
    assert keeper.summary() == HoldSummary(2, 0.004, 2, 0.004, 1100.0)
    gens.records["gen-1"] = {"tokens_prompt": 100, "tokens_completion": 300, "total_cost": 0.0007}
    await keeper.step()
    ((charge, key),) = settled
    assert key == 1 and charge is not None and charge.kind == "lost"
    assert charge.usage.cost_usd == 0.0007 and charge.generation_id == "gen-1"
    assert book.datasets["a"].scope.held == 1 and book.datasets["a"].scope.spent_usd == 0.0007
    assert keeper.freed_earlier_usd == 0.002 - 0.0007
    gens.records["gen-2"] = {"tokens_prompt": 100, "tokens_completion": 0, "total_cost": 0}
    clock.now += 60
    await keeper.step()  # a generation that billed nothing releases its hold with no charge
    assert settled[-1] == (None, 2) and book.job.held == 0 and not keeper.held


async def test_a_bill_never_found_counts_at_what_the_accounts_unexplained_spend_allows() -> None:
    """Past its deadline, a request whose bill never showed counts at most its worst case,
    and no more than the account's spend that the ledger does not explain (all of it on a
    key of the job's own; a shared key's other users' spend can only raise it to the worst
    case, never past it)."""
    book = two_datasets(max_cost_usd=0.01)
    keeper, _, settled, clock = keeper_for(book, unexplained=0.0025)
    keeper.load([sent(1, None), sent(2, None), sent(3, None, deadline=5000.0)], lambda ep: True)
    await keeper.step()
    assert settled == []  # not yet due
    clock.now = 1200.0
    await keeper.step()
    charges = [c for c, _ in settled]
    assert [c.usage.cost_usd if c else None for c in charges] == [0.002, 0.0005]
    assert all(c is not None and c.kind == "unverified" for c in charges)
    assert keeper.released_unverified == 0.0025 and list(keeper.held) == [3]


async def test_requests_to_servers_that_abort_them_are_released_at_once() -> None:
    book = two_datasets(max_cost_usd=0.01)
    keeper, _, settled, _ = keeper_for(book)
    held = keeper.load([sent(1, None, endpoint="vllm")], lambda ep: ep != "vllm")
    assert held == 0 and settled == [(None, 1)] and book.job.held == 0
    assert keeper.freed_earlier_usd == 0.002


async def test_this_runs_cut_short_requests_are_looked_up_after_a_wait() -> None:
    book = two_datasets(max_cost_usd=0.01)
    keeper, gens, settled, clock = keeper_for(book)
    lease = admit(book)
    assert isinstance(lease, Lease)
    book.hold(lease)
    keeper.add(
        Sent(
            7, 1, "item7", "a", "lane", "or", lease.worst_usd, lease.tokens, 990.0, 1100.0, "gen-7"
        )
    )
    gens.records["gen-7"] = {"tokens_prompt": 10, "tokens_completion": 20, "total_cost": 0.0001}
    await keeper.step()
    assert gens.asked == []  # its record lags the answer: asked after a second
    await asyncio.wait_for(keeper.settle_all(5.0), 1.0)
    assert [(c.kind if c else None, k) for c, k in settled] == [("failed_attempt", 7)]
    assert keeper.freed_earlier_usd == 0.0  # this run's own: its key pays it


async def test_bills_to_be_found_by_id_are_counted_before_the_rest_share_what_is_unexplained() -> (
    None
):
    """The account's spend beyond the ledger holds the bills still to be found by their ids
    too: a request without one is counted only once those are, or it would take their share
    and the ledger would count them twice."""
    book = two_datasets(max_cost_usd=0.01)
    keeper, gens, settled, clock = keeper_for(book, unexplained=0.0015)
    keeper.load([sent(1, None), sent(2, "gen-2", deadline=1500.0)], lambda ep: True)
    clock.now = 1200.0  # the first is past its deadline; the second's bill is not there yet
    await keeper.step()
    assert settled == [] and set(keeper.held) == {1, 2}
    gens.records["gen-2"] = {"tokens_prompt": 10, "tokens_completion": 100, "total_cost": 0.001}
    clock.now += 1.0  # its next look-up
    await keeper.step()
    # Found first, then the other takes what the account leaves unexplained (the ledger, which
    # the keeper commits before it reads the account, now has the first).
    assert [(c.kind if c else None, key) for c, key in settled] == [
        ("lost", 2),
        ("unverified", 1),
    ]
