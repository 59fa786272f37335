"""Which views a prepare naming no event may serve again without reading the ledger."""

from __future__ import annotations

from services.app.view_trust import ViewTrust
from services.store.view_changes import calibration_change_of, change_of, head_move_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _trust(clock: Clock | None = None, **kw: int) -> ViewTrust[str]:
    trust: ViewTrust[str] = ViewTrust(max_age_s=5.0, clock=clock or Clock(), **kw)
    trust.listening()
    return trust


def _load(
    trust: ViewTrust[str],
    view: str,
    thread: str = "r1.main",
    session: str = "s1",
    run: str = "r1",
    revision: int = 1,
) -> None:
    trust.keep(trust.token(), thread, session, run, view, revision)


def test_a_view_loaded_while_listening_is_served_until_its_thread_changes() -> None:
    trust = _trust()
    _load(trust, "v1")
    assert trust.view("r1.main") == "v1"
    assert trust.view("r1.main") == "v1"
    trust.changed("thread", "r1.main")
    assert trust.view("r1.main") is None
    assert trust.served == 2


def test_a_change_of_another_thread_leaves_the_view_trusted() -> None:
    trust = _trust()
    _load(trust, "v1")
    trust.changed("thread", "r1.child")
    trust.changed("session", "s2")
    trust.changed("run", "r2")
    assert trust.view("r1.main") == "v1"


def test_a_change_of_its_session_or_its_run_ends_the_trust() -> None:
    for kind, key in (("session", "s1"), ("run", "r1")):
        trust = _trust()
        _load(trust, "v1")
        trust.changed(kind, key)  # type: ignore[arg-type]
        assert trust.view("r1.main") is None, kind


def test_a_change_announced_while_the_load_ran_keeps_its_view_from_being_trusted() -> None:
    trust = _trust()
    token = trust.token()  # before the statement
    trust.changed("thread", "r1.main")  # committed after the load's snapshot, announced meanwhile
    trust.keep(token, "r1.main", "s1", "r1", "v1", 1)
    assert trust.view("r1.main") is None
    token = trust.token()
    trust.changed("session", "s1")
    trust.keep(token, "r1.main", "s1", "r1", "v1", 1)
    assert trust.view("r1.main") is None


def test_an_older_load_finishing_last_does_not_replace_a_newer_view() -> None:
    trust = _trust()
    older = trust.token()
    trust.changed("thread", "r9.other")  # any change between the two loads began
    newer = trust.token()
    trust.keep(newer, "r1.main", "s1", "r1", "new", 1)
    trust.keep(older, "r1.main", "s1", "r1", "old", 1)
    assert trust.view("r1.main") == "new"


def test_nothing_is_trusted_while_the_listener_is_down_nor_what_was_loaded_before_it_came_back() -> None:
    trust = _trust()
    _load(trust, "v1")
    before = trust.token()
    trust.deaf()
    assert trust.view("r1.main") is None
    assert trust.token() is None
    _load(trust, "v2")  # loaded deaf: not kept
    trust.listening()
    assert trust.view("r1.main") is None
    trust.keep(before, "r1.main", "s1", "r1", "v0", 1)  # a load begun before the listener was lost
    assert trust.view("r1.main") is None
    _load(trust, "v3")
    assert trust.view("r1.main") == "v3"


def test_a_view_is_due_again_at_half_its_age_and_expires_at_its_age() -> None:
    clock = Clock()
    trust = _trust(clock)
    _load(trust, "v1")
    clock.now += 2.4
    assert not trust.due("r1.main")
    clock.now += 0.2
    assert trust.due("r1.main")
    assert trust.view("r1.main") == "v1"
    clock.now += 2.5
    assert trust.view("r1.main") is None
    assert not trust.due("r1.main")


def test_an_age_of_zero_turns_trust_off() -> None:
    trust: ViewTrust[str] = ViewTrust(max_age_s=0)
    trust.listening()
    assert not trust.enabled
    assert trust.token() is None
    trust.keep(None, "r1.main", "s1", "r1", "v1", 1)
    assert trust.view("r1.main") is None


def test_a_view_older_than_the_changes_it_remembers_is_not_trusted() -> None:
    trust = _trust(max_changes=2)
    _load(trust, "v1")
    trust.changed("session", "s8")
    trust.changed("session", "s9")
    assert trust.view("r1.main") == "v1"
    trust.changed("run", "r7")  # forgets s8's change: was it this view's? It cannot tell any more
    assert trust.view("r1.main") is None
    _load(trust, "v2")
    assert trust.view("r1.main") == "v2"


def test_a_notice_it_cannot_attribute_ends_all_trust() -> None:
    trust = _trust()
    _load(trust, "v1")
    _load(trust, "w1", thread="r2.main", session="s2", run="r2")
    trust.everything_changed()
    assert trust.view("r1.main") is None
    assert trust.view("r2.main") is None


def test_views_held_are_bounded_least_recently_loaded_first_and_forgotten_on_request() -> None:
    trust = _trust(max_views=2)
    _load(trust, "a", thread="a")
    _load(trust, "b", thread="b")
    _load(trust, "c", thread="c")
    assert len(trust) == 2
    assert trust.view("a") is None
    trust.forget("b")
    assert trust.view("b") is None
    assert trust.view("c") == "c"


def test_notices_name_a_thread_a_session_or_a_run_and_anything_else_is_unknown() -> None:
    assert change_of("t:r1.main") == ("thread", "r1.main")
    assert change_of("s:sess-1") == ("session", "sess-1")
    assert change_of("r:run:with:colons") == ("run", "run:with:colons")
    assert change_of("x:what") is None
    assert change_of("t:") is None
    assert change_of("nonsense") is None
    assert change_of("*") is None  # a TRUNCATE


def test_a_head_moved_past_the_view_ends_its_trust_and_a_move_it_already_shows_does_not() -> None:
    trust = _trust()
    _load(trust, "v2", revision=2)
    trust.head_moved("r1.main", 2)  # the move the view was loaded at, announced after its load
    trust.head_moved("r1.child", 7)
    assert trust.view("r1.main") == "v2"
    trust.head_moved("r1.main", 3)
    assert trust.view("r1.main") is None


def test_a_view_extended_to_the_head_its_process_moved_it_to_survives_that_moves_notice_only() -> None:
    for notice_first in (False, True):
        trust = _trust()
        _load(trust, "v1", revision=1)
        if notice_first:
            trust.head_moved("r1.main", 2)  # the listener heard the commit before the recorder said so
        assert trust.extend("r1.main", 1, 2, lambda view: view + "+r2")
        trust.head_moved("r1.main", 2)
        assert trust.view("r1.main") == "v1+r2", notice_first
        assert trust.extended == 1
        trust.head_moved("r1.main", 3)  # another writer's move
        assert trust.view("r1.main") is None


def test_a_view_is_not_extended_from_another_head_after_a_change_or_when_its_builder_declines() -> None:
    trust = _trust()
    _load(trust, "v1", revision=1)
    assert not trust.extend("r1.main", 2, 3, lambda view: view + "+r3")  # not the head it holds
    assert not trust.extend("r1.main", 1, 2, lambda view: None)
    assert trust.view("r1.main") == "v1"
    trust.changed("session", "s1")  # a summary, a reset, a policy: anything else
    assert not trust.extend("r1.main", 1, 2, lambda view: view + "+r2")
    assert not trust.extend("r1.other", 0, 1, lambda view: view)  # nothing held
    assert trust.extended == 0


def test_an_extended_view_ages_as_of_the_load_it_came_from() -> None:
    clock = Clock()
    trust = _trust(clock)
    _load(trust, "v1", revision=1)
    clock.now += 4.0
    assert trust.extend("r1.main", 1, 2, lambda view: view + "+r2")
    clock.now += 1.5
    assert trust.view("r1.main") is None


def test_a_view_declined_by_the_prepare_asking_is_not_served_nor_dropped() -> None:
    trust = _trust()
    _load(trust, "v1", revision=4)
    assert trust.view("r1.main", accept=lambda view: view == "v2") is None
    assert trust.view("r1.main", accept=lambda view: view == "v1") == "v1"
    assert trust.served == 1


def test_head_move_notices_name_their_revision_and_thread() -> None:
    assert head_move_of("h:12:r1.main") == ("r1.main", 12)
    assert head_move_of("h:3:run:with:colons.main") == ("run:with:colons.main", 3)
    assert head_move_of("t:r1.main") is None
    assert head_move_of("h:x:r1.main") is None
    assert head_move_of("h:12:") is None


def test_a_calibration_read_under_a_token_is_current_until_its_own_change_is_announced() -> None:
    trust = _trust()
    token = trust.token()
    assert token is not None
    trust.calibration_changed("acme", "claude-haiku")  # another profile
    trust.calibration_changed("globex", "claude-sonnet")  # another tenant's
    trust.changed("thread", "r1.main")  # views' changes say nothing of it
    assert trust.calibration_current(token, "acme", "claude-sonnet")
    trust.calibration_changed("acme", "claude-sonnet")
    assert not trust.calibration_current(token, "acme", "claude-sonnet")
    later = trust.token()
    assert later is not None and trust.calibration_current(later, "acme", "claude-sonnet")


def test_a_calibration_stops_being_current_when_the_listener_drops_ages_or_hears_something_unknown() -> None:
    clock = Clock()
    trust = _trust(clock)
    token = trust.token()
    assert token is not None
    clock.now += 5.5
    assert not trust.calibration_current(token, "acme", "claude-sonnet")  # past max_age_s
    token = trust.token()
    assert token is not None
    trust.everything_changed()
    assert not trust.calibration_current(token, "acme", "claude-sonnet")
    token = trust.token()
    assert token is not None
    trust.deaf()
    trust.listening()
    assert not trust.calibration_current(token, "acme", "claude-sonnet")  # notices may have been lost


def test_calibration_notices_name_a_tenant_and_a_profile_of_any_characters() -> None:
    assert calibration_change_of('c:["acme","claude-sonnet-4"]') == ("acme", "claude-sonnet-4")
    assert calibration_change_of('c:["a:b","x\\"y, z"]') == ("a:b", 'x"y, z')
    assert calibration_change_of("c:acme") is None
    assert calibration_change_of('c:["acme"]') is None
    assert calibration_change_of('c:["acme", 3]') is None
    assert calibration_change_of('t:["acme","p"]') is None
