"""Job, lease and worker states: terminal states, exit statuses and the shown worker word."""

import pytest

from service.core.states import (
    LIVE_JOB_STATES,
    TERMINAL,
    JobState,
    Liveness,
    WorkerState,
    exit_status,
    shown_worker_state,
)


class TestExitStatus:
    @pytest.mark.parametrize(
        ("state", "code", "status"),
        [
            (JobState.SUCCEEDED, 0, 0),
            (JobState.SUCCEEDED, None, 0),
            (JobState.FAILED, 3, 3),
            (JobState.FAILED, 255, 255),
            (JobState.FAILED, None, 1),
            (JobState.FAILED, 0, 1),
            (JobState.TIMED_OUT, None, 124),
            (JobState.TIMED_OUT, 143, 124),
            (JobState.CANCELLED, None, 130),
            (JobState.CANCELLED, 143, 130),
        ],
    )
    def test_mapping(self, state, code, status):
        """`job submit --wait` exits as a local run would: 0, the code, 124 or 130."""
        assert exit_status(state, code) == status

    @pytest.mark.parametrize("state", [JobState.QUEUED, JobState.LEASED, JobState.RUNNING])
    def test_not_terminal_is_failure(self, state):
        """A state that is not terminal never maps to success."""
        assert exit_status(state, None) == 1


class TestTerminal:
    def test_set(self):
        """The terminal states are exactly succeeded, failed, cancelled and timed_out."""
        assert {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMED_OUT,
        } == TERMINAL

    @pytest.mark.parametrize("state", list(JobState))
    def test_property(self, state):
        """JobState.terminal agrees with the TERMINAL set, and live states are not terminal."""
        assert state.terminal is (state in TERMINAL)
        if state in LIVE_JOB_STATES:
            assert not state.terminal

    def test_live_states(self):
        """A job holding a lease is leased or running."""
        assert set(LIVE_JOB_STATES) == {JobState.LEASED, JobState.RUNNING}

    def test_values(self):
        """State names on the wire are the lower-case words of the contract."""
        assert [str(s) for s in JobState] == [
            "queued",
            "leased",
            "running",
            "succeeded",
            "failed",
            "cancelled",
            "timed_out",
        ]


class TestShownWorkerState:
    @pytest.mark.parametrize(
        ("state", "liveness", "shown"),
        [
            (WorkerState.ACTIVE, Liveness.OK, "active"),
            (WorkerState.DRAINING, Liveness.OK, "draining"),
            (WorkerState.DISABLED, Liveness.OK, "disabled"),
            (WorkerState.ACTIVE, Liveness.UNREACHABLE, "unreachable"),
            (WorkerState.DRAINING, Liveness.UNREACHABLE, "unreachable"),
            (WorkerState.DISABLED, Liveness.LOST, "lost"),
            (WorkerState.ACTIVE, Liveness.LOST, "lost"),
            (WorkerState.ACTIVE, Liveness.GONE, "offline"),
            (WorkerState.DISABLED, Liveness.GONE, "offline"),
        ],
    )
    def test_word(self, state, liveness, shown):
        """Silence (unreachable, lost, offline) wins over what an operator set."""
        assert shown_worker_state(state, liveness) == shown
