"""Token quotas per key and per team against a real Redis: reserved at admission, settled at
release, refused past the quota with the quota named and its reset; day, month and team apart."""

from __future__ import annotations

import datetime
import time
import uuid

import pytest
import redis.asyncio as aioredis

from router.admission.auth import Caller
from router.admission.limits import Admission, Ticket
from router.admission.quotas import QuotaHold
from router.openai.errors import TooManyRequestsError
from router.queue.enqueue import JobQueue
from switchboard import keys
from switchboard.config import LimitsConfig
from switchboard.quotas import Periods
from switchboard.tasks import TaskSet
from switchboard.wire import Job, LoadFailure, SamplingParams, encode
from tests.support.callers import key_caller
from tests.support.jobs import admit_and_submit

MODEL = "tiny"
UTC = datetime.UTC


def job(max_tokens: int = 60) -> Job:
    """A job estimated at 1 + `max_tokens` tokens (a 2-character prompt)."""
    now = time.time()
    return Job(
        id=uuid.uuid4().hex,
        model=MODEL,
        prompts=("Hi",),
        sampling=SamplingParams(max_tokens=max_tokens),
        created=now,
        deadline=now + 60,
    )


def at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def counted(redis: aioredis.Redis, counter: str) -> int:
    return int(await redis.get(counter) or 0)


def counters(caller: Caller) -> tuple[str, str, str, str]:
    """The caller's counters of today: the key's day and month, its team's day and month."""
    periods = Periods.at(time.time())
    team = caller.team or "-"
    return (
        keys.key_tokens(caller.owner, periods.day),
        keys.key_tokens(caller.owner, periods.month),
        keys.team_tokens(team, periods.day),
        keys.team_tokens(team, periods.month),
    )


async def refused(admission: Admission, caller: Caller, max_tokens: int = 60) -> TooManyRequestsError:
    with pytest.raises(TooManyRequestsError) as caught:
        await admission.admit(job(max_tokens), caller)
    return caught.value


@pytest.mark.parametrize(
    ("now", "day", "month", "day_ends", "month_ends"),
    [
        ("2025-01-31T23:59:59", "day:2025-01-31", "month:2025-01", "2025-02-01", "2025-02-01"),
        ("2025-02-01T00:00:00", "day:2025-02-01", "month:2025-02", "2025-02-02", "2025-03-01"),
        ("2024-02-29T12:00:00", "day:2024-02-29", "month:2024-02", "2024-03-01", "2024-03-01"),
        ("2025-12-31T08:30:00", "day:2025-12-31", "month:2025-12", "2026-01-01", "2026-01-01"),
    ],
)
def test_periods_are_utc_calendar_days_and_months(
    now: str, day: str, month: str, day_ends: str, month_ends: str
) -> None:
    periods = Periods.at(at(now))
    assert (periods.day, periods.month) == (day, month)
    assert periods.day_ends == at(f"{day_ends}T00:00:00")
    assert periods.month_ends == at(f"{month_ends}T00:00:00")


async def test_tokens_are_reserved_at_admission_and_settled_with_real_usage(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tokens_per_day=1000, tokens_per_month=5000)
    day, month, _, _ = counters(caller)
    ticket = await admission.admit(job(60), caller)
    assert (await counted(redis, day), await counted(redis, month)) == (61, 61)
    await ticket.release(11)
    assert (await counted(redis, day), await counted(redis, month)) == (11, 11)
    # A job that used more than its estimate is charged what it used.
    ticket = await admission.admit(job(10), caller)
    await ticket.release(30)
    assert await counted(redis, day) == 41
    # Kept a while past the end of its period: the day's until tomorrow plus QUOTA_KEPT_S.
    periods = Periods.at(time.time())
    assert await redis.ttl(day) == pytest.approx(periods.day_ends + keys.QUOTA_KEPT_S - time.time(), abs=5)
    assert await redis.ttl(month) == pytest.approx(
        periods.month_ends + keys.QUOTA_KEPT_S - time.time(), abs=5
    )


async def test_past_the_quota_a_request_is_refused_naming_it_and_its_reset(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tokens_per_day=100)
    day = counters(caller)[0]
    await admission.admit(job(60), caller)  # 61 reserved: 61 more would make 122
    error = await refused(admission, caller)
    assert (error.status_code, error.code, error.error_type) == (429, "quota_exceeded", "tokens")
    tomorrow = datetime.datetime.fromtimestamp(Periods.at(time.time()).day_ends, UTC)
    assert "key `alice` on tokens per day" in error.message
    assert "limit 100, 61 used or reserved, this request counts about 61" in error.message
    assert f"resets at {tomorrow:%Y-%m-%dT%H:%M:%SZ}" in error.message
    assert int(error.headers["Retry-After"]) == pytest.approx(tomorrow.timestamp() - time.time(), abs=5)
    # Nothing was committed, and a request that fits what is left is admitted.
    assert await counted(redis, day) == 61
    await admission.admit(job(38), caller)
    assert await counted(redis, day) == 100
    await refused(admission, caller, max_tokens=1)
    # Another key's quota is its own.
    await admission.admit(job(60), key_caller("bob", tokens_per_day=100))


async def test_a_request_larger_than_the_whole_quota_is_told_so(redis: aioredis.Redis) -> None:
    error = await refused(Admission(redis, LimitsConfig()), key_caller("alice", tokens_per_day=50))
    assert "alone counts more than the whole quota" in error.message


async def test_the_month_quota_holds_apart_from_the_day_and_resets_on_the_first(
    redis: aioredis.Redis,
) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tokens_per_day=1000, tokens_per_month=100)
    await admission.admit(job(60), caller)
    error = await refused(admission, caller)
    assert "key `alice` on tokens per month" in error.message
    first = datetime.datetime.fromtimestamp(Periods.at(time.time()).month_ends, UTC)
    assert first.day == 1 and f"resets at {first:%Y-%m-%dT00:00:00Z}" in error.message
    assert int(error.headers["Retry-After"]) == pytest.approx(first.timestamp() - time.time(), abs=5)


async def test_a_team_quota_is_shared_by_its_keys_and_counted_apart_from_theirs(
    redis: aioredis.Redis,
) -> None:
    admission = Admission(redis, LimitsConfig())
    alice = key_caller("alice", tokens_per_day=100, team="acme", team_tokens_per_day=150)
    bob = key_caller("bob", team="acme", team_tokens_per_day=150)
    await admission.admit(job(60), alice)
    await admission.admit(job(60), bob)
    error = await refused(admission, bob)
    assert "team `acme` (of key `bob`) on tokens per day" in error.message
    assert "limit 150, 122 used or reserved" in error.message
    # alice meets her own quota first; the team's counters hold both keys' tokens.
    assert "key `alice` on tokens per day" in (await refused(admission, alice)).message
    alice_day, _, team_day, team_month = counters(alice)
    assert await counted(redis, alice_day) == 61 and await counted(redis, counters(bob)[0]) == 61
    assert (await counted(redis, team_day), await counted(redis, team_month)) == (122, 122)
    # A team's month quota refuses with its own words.
    other = key_caller("carol", team="beta", team_tokens_per_month=100)
    await admission.admit(job(60), other)
    assert "team `beta` (of key `carol`) on tokens per month" in (await refused(admission, other)).message


async def test_a_team_without_quotas_and_a_key_without_any_are_counted_or_not(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    member = key_caller("alice", team="acme")
    ticket = await admission.admit(job(60), member)
    _, _, team_day, team_month = counters(member)
    assert (await counted(redis, team_day), await counted(redis, team_month)) == (61, 61)
    await ticket.release(5)
    assert await counted(redis, team_day) == 5 and await counted(redis, counters(member)[0]) == 5
    # A key with neither quota nor team writes no counter at all.
    await redis.flushdb()
    await (await admission.admit(job(60), key_caller("bob"))).release(5)
    assert not [key async for key in redis.scan_iter(match="*tokens*")]


async def test_yesterdays_tokens_do_not_count_today_and_a_late_release_settles_yesterday(
    redis: aioredis.Redis,
) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tokens_per_day=100)
    yesterday = QuotaHold.of(caller, time.time() - 86400)
    await redis.set(yesterday.counters[0], 61, ex=3600)
    today = await admission.admit(job(60), caller)
    assert await counted(redis, counters(caller)[0]) == 61
    # A job admitted yesterday that ends now is settled on yesterday's counter.
    await Ticket(admission, "late", caller, 61, yesterday).release(1)
    assert await counted(redis, yesterday.counters[0]) == 1
    assert await counted(redis, counters(caller)[0]) == 61
    await today.release(None)  # no usage known: the estimate stands
    assert await counted(redis, counters(caller)[0]) == 61


async def test_admitted_and_queued_in_one_round_trip_and_given_back_for_a_failed_model(
    redis: aioredis.Redis,
) -> None:
    admission, queue = Admission(redis, LimitsConfig()), JobQueue(redis, TaskSet("test"))
    caller = key_caller("alice", tokens_per_day=100, team="acme", team_tokens_per_month=1000)
    first = job(60)
    assert await admit_and_submit(queue, first, admission.admitting(first, caller), owner="") is None
    day, _, _, team_month = counters(caller)
    assert (await counted(redis, day), await counted(redis, team_month)) == (61, 61)
    second = job(60)
    with pytest.raises(TooManyRequestsError) as refused_one:
        await admit_and_submit(queue, second, admission.admitting(second, caller), owner="")
    assert refused_one.value.code == "quota_exceeded"
    assert not await redis.exists(keys.job_record(second.id))
    # A model whose last load failed takes no job, and the job's reservation comes back.
    now = time.time()
    failure = LoadFailure(model=MODEL, worker_id="w", reason="oom", failed_at=now, retry_at=now + 30)
    await redis.set(keys.load_failure(MODEL), encode(failure), ex=30)
    third = job(10)
    assert await admit_and_submit(queue, third, admission.admitting(third, caller), owner="") is not None
    assert (await counted(redis, day), await counted(redis, team_month)) == (61, 61)


async def test_a_resumed_stream_reserves_on_the_quota_too(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tokens_per_day=100)
    # An unknown job's record keeps no estimate: the answer's (max_tokens) is reserved.
    ticket = await admission.admit_resume(job(60), caller)
    assert ticket.reserved_tokens == 60 and await counted(redis, counters(caller)[0]) == 60
    error = await refused(admission, caller)
    assert error.code == "quota_exceeded"
    with pytest.raises(TooManyRequestsError):
        await admission.admit_resume(job(60), caller)
    await ticket.release(0)
    assert await counted(redis, counters(caller)[0]) == 0
