//! The execution state machine: which state may follow which.
//!
//! | from | to |
//! |---|---|
//! | pending | starting, failed, cancelled |
//! | starting | running, failed, lost, cancelled |
//! | running | completed, failed, cancelled, lost, backoff, starting, waiting |
//! | waiting | running, completed, failed, cancelled, lost, backoff, starting |
//! | failed | backoff, starting |
//! | lost | backoff, starting, failed |
//! | backoff | starting, failed, cancelled |
//! | completed, cancelled | starting |
//!
//! `failed` and `lost` are final when no restart follows. The supervisor
//! commits a transition and the decision that follows it (restart or not)
//! in one transaction, so a *stored* `failed` or `lost` is always final; see
//! [`is_final`]. Only `tether resume` leaves a final state (to
//! `starting`), and only `tether restart` goes from `running` straight to
//! `starting`.
//!
//! `waiting` is `running` with a question of the current attempt open
//! (`tether ask`). The daemon shows it from the open questions and never
//! stores it (see [`crate::gates`]), so a stored manifest says `running`
//! and every rule of `running` (a shim alive, stop, restart, recovery)
//! holds for a waiting execution as it is.

use tether_protocol::ExecState;

/// True when `to` may follow `from`.
pub fn allowed(from: ExecState, to: ExecState) -> bool {
    use ExecState::*;
    matches!(
        (from, to),
        (Pending, Starting | Failed | Cancelled)
            | (Starting, Running | Failed | Lost | Cancelled)
            | (
                Running,
                Completed | Failed | Cancelled | Lost | Backoff | Starting | Waiting
            )
            | (
                Waiting,
                Running | Completed | Failed | Cancelled | Lost | Backoff | Starting
            )
            | (Failed, Backoff | Starting)
            | (Lost, Backoff | Starting | Failed)
            | (Backoff, Starting | Failed | Cancelled)
            | (Completed | Cancelled, Starting)
    )
}

/// True for the states an execution ends in, as stored. A stored `failed`
/// or `lost` is final because the supervisor never commits one on its own
/// when a restart follows.
pub fn is_final(state: ExecState) -> bool {
    matches!(
        state,
        ExecState::Completed | ExecState::Cancelled | ExecState::Failed | ExecState::Lost
    )
}

/// True while a shim may be alive for the current attempt.
pub fn has_shim(state: ExecState) -> bool {
    matches!(
        state,
        ExecState::Starting | ExecState::Running | ExecState::Waiting
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecState::*;

    const ALL: [ExecState; 9] = [
        Pending, Starting, Running, Backoff, Completed, Failed, Cancelled, Lost, Waiting,
    ];

    const LEGAL: [(ExecState, ExecState); 31] = [
        (Running, Waiting),
        (Waiting, Running),
        (Waiting, Completed),
        (Waiting, Failed),
        (Waiting, Cancelled),
        (Waiting, Lost),
        (Waiting, Backoff),
        (Waiting, Starting),
        (Pending, Starting),
        (Pending, Failed),
        (Pending, Cancelled),
        (Starting, Running),
        (Starting, Failed),
        (Starting, Lost),
        (Starting, Cancelled),
        (Running, Completed),
        (Running, Failed),
        (Running, Cancelled),
        (Running, Lost),
        (Running, Backoff),
        (Running, Starting),
        (Failed, Backoff),
        (Failed, Starting),
        (Lost, Backoff),
        (Lost, Starting),
        (Lost, Failed),
        (Backoff, Starting),
        (Backoff, Failed),
        (Backoff, Cancelled),
        (Completed, Starting),
        (Cancelled, Starting),
    ];

    #[test]
    fn every_legal_transition_is_allowed() {
        for (from, to) in LEGAL {
            assert!(allowed(from, to), "{from:?} -> {to:?} must be allowed");
        }
    }

    #[test]
    fn exactly_the_listed_transitions_are_allowed() {
        for from in ALL {
            for to in ALL {
                assert_eq!(
                    allowed(from, to),
                    LEGAL.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn sample_of_illegal_transitions_is_refused() {
        for (from, to) in [
            (Completed, Running),
            (Completed, Backoff),
            (Cancelled, Running),
            (Cancelled, Completed),
            (Lost, Completed),
            (Pending, Running),
            (Pending, Completed),
            (Backoff, Running),
            (Running, Pending),
            (Failed, Completed),
            (Lost, Running),
            (Starting, Completed),
            (Running, Running),
            (Waiting, Waiting),
            (Waiting, Pending),
            (Pending, Waiting),
            (Backoff, Waiting),
            (Completed, Waiting),
        ] {
            assert!(!allowed(from, to), "{from:?} -> {to:?} must be refused");
        }
    }

    #[test]
    fn final_states_have_no_way_out_but_a_new_attempt() {
        for to in ALL {
            assert_eq!(
                allowed(Completed, to),
                to == Starting,
                "completed -> {to:?}"
            );
            assert_eq!(
                allowed(Cancelled, to),
                to == Starting,
                "cancelled -> {to:?}"
            );
        }
        assert!(is_final(Failed) && is_final(Lost));
        assert!(!is_final(Backoff) && !is_final(Pending));
    }
}
