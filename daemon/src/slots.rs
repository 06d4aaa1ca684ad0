//! Connection slots: how many sessions the daemon serves at once, and how
//! they are shared out, so that no local user can lock the others out.
//!
//! * At most `max_connections` sessions in all (lowered to what the
//!   open-file limit leaves room for, see [`crate::server`]).
//! * [`RESERVED_SLOTS`] of them are kept for root and the daemon's own
//!   user: everyone else together holds at most the rest.
//! * One uid other than those two holds at most `max_connections_per_uid`
//!   (default: a quarter of the limit).
//!
//! A connection takes its slot only after its peer passed the access
//! check, so a refused user holds none. The slot is given back when its
//! [`Slot`] is dropped, at the end of the session.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Slots kept for root and the daemon's own user (half the limit when the
/// limit is below twice this, so that a small limit still serves others).
pub const RESERVED_SLOTS: usize = 32;

/// The limits, as numbers of sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sessions in all.
    pub total: usize,
    /// Sessions of one uid other than root and the owner.
    pub per_uid: usize,
    /// Of `total`, those only root and the owner may take.
    pub reserved: usize,
}

impl Limits {
    /// The limits for `total` sessions, with `per_uid` as configured
    /// (`None`: a quarter of `total`).
    pub fn new(total: usize, per_uid: Option<usize>) -> Self {
        let total = total.max(1);
        Self {
            total,
            per_uid: per_uid.unwrap_or(total / 4).max(1),
            reserved: RESERVED_SLOTS.min(total / 2),
        }
    }

    /// Sessions that users other than root and the owner hold together.
    pub fn shared(&self) -> usize {
        self.total - self.reserved
    }
}

/// Why a connection gets no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// Every slot is taken.
    Total(Limits),
    /// Every slot open to users other than root and the owner is taken.
    Shared(Limits),
    /// The peer's uid holds its maximum.
    PerUid(Limits),
}

impl NoSlot {
    /// The sentence the refused peer `who` is told: the limit it met.
    pub fn describe(&self, who: &dyn fmt::Display) -> String {
        match self {
            NoSlot::Total(l) => format!(
                "the daemon is serving its maximum of {} connections; try again later",
                l.total
            ),
            NoSlot::Shared(l) => format!(
                "the daemon is serving its maximum of {} connections for users other than \
                 root and its owner (max_connections {} less {} kept for them); \
                 try again later",
                l.shared(),
                l.total,
                l.reserved
            ),
            NoSlot::PerUid(l) => format!(
                "{who} holds its maximum of {} connections (max_connections_per_uid); \
                 close one or try again later",
                l.per_uid
            ),
        }
    }
}

/// The slots and who holds them.
#[derive(Debug)]
pub struct Slots {
    limits: Limits,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Sessions in all.
    total: usize,
    /// Sessions of users other than root and the owner.
    shared: usize,
    /// Those sessions by uid; a uid holding none has no entry.
    by_uid: HashMap<u32, usize>,
}

impl Slots {
    /// No slot taken yet.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            held: Mutex::new(Held::default()),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes a slot for a session of `uid`; `privileged` for root and the
    /// owner, who may use the reserve and have no limit of their own.
    pub fn take(self: &Arc<Self>, uid: u32, privileged: bool) -> Result<Slot, NoSlot> {
        let limits = self.limits;
        let mut held = self.lock();
        if held.total >= limits.total {
            return Err(NoSlot::Total(limits));
        }
        if !privileged {
            let of_uid = held.by_uid.get(&uid).copied().unwrap_or(0);
            if of_uid >= limits.per_uid {
                return Err(NoSlot::PerUid(limits));
            }
            if held.shared >= limits.shared() {
                return Err(NoSlot::Shared(limits));
            }
            held.shared += 1;
            held.by_uid.insert(uid, of_uid + 1);
        }
        held.total += 1;
        Ok(Slot {
            slots: self.clone(),
            uid,
            privileged,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // The counts are updated in single statements that cannot panic
        // halfway: a poisoned lock still holds consistent counts.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, uid: u32, privileged: bool) {
        let mut held = self.lock();
        held.total = held.total.saturating_sub(1);
        if privileged {
            return;
        }
        held.shared = held.shared.saturating_sub(1);
        if let Some(n) = held.by_uid.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_uid.remove(&uid);
            }
        }
    }
}

/// One session's slot, given back on drop.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    uid: u32,
    privileged: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.give_back(self.uid, self.privileged);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const OWNER: u32 = 1000;
    const ALICE: u32 = 1001;
    const BOB: u32 = 1002;

    #[test]
    fn the_defaults_are_a_quarter_per_uid_and_32_reserved() {
        assert_eq!(
            Limits::new(4096, None),
            Limits {
                total: 4096,
                per_uid: 1024,
                reserved: 32
            }
        );
        assert_eq!(Limits::new(4096, Some(7)).per_uid, 7);
        // A small limit keeps half for others, and one slot per uid.
        assert_eq!(
            Limits::new(2, None),
            Limits {
                total: 2,
                per_uid: 1,
                reserved: 1
            }
        );
    }

    #[test]
    fn one_uid_holds_at_most_its_cap_and_gets_slots_back() {
        let slots = Slots::new(Limits::new(100, Some(2)));
        let a1 = slots.take(ALICE, false).unwrap();
        let _a2 = slots.take(ALICE, false).unwrap();
        assert_eq!(
            slots.take(ALICE, false).unwrap_err(),
            NoSlot::PerUid(slots.limits())
        );
        // Another user is not held back by Alice.
        let _b = slots.take(BOB, false).unwrap();
        drop(a1);
        let _a3 = slots.take(ALICE, false).unwrap();
    }

    #[test]
    fn others_cannot_take_the_reserve_but_the_owner_can() {
        let slots = Slots::new(Limits::new(64, Some(1000)));
        let mut held = Vec::new();
        for i in 0..32 {
            held.push(slots.take(ALICE + i % 2, false).unwrap());
        }
        assert_eq!(
            slots.take(BOB, false).unwrap_err(),
            NoSlot::Shared(slots.limits())
        );
        for _ in 0..32 {
            held.push(slots.take(OWNER, true).unwrap());
        }
        assert_eq!(
            slots.take(0, true).unwrap_err(),
            NoSlot::Total(slots.limits())
        );
        held.clear();
        let _all_back = slots.take(BOB, false).unwrap();
    }

    #[test]
    fn refusals_name_the_limit_they_met() {
        let limits = Limits::new(64, Some(3));
        assert_eq!(
            NoSlot::PerUid(limits).describe(&"uid 1001 (alice)"),
            "uid 1001 (alice) holds its maximum of 3 connections (max_connections_per_uid); \
             close one or try again later"
        );
        assert_eq!(
            NoSlot::Shared(limits).describe(&"uid 1001 (alice)"),
            "the daemon is serving its maximum of 32 connections for users other than root \
             and its owner (max_connections 64 less 32 kept for them); try again later"
        );
        assert_eq!(
            NoSlot::Total(limits).describe(&"uid 0"),
            "the daemon is serving its maximum of 64 connections; try again later"
        );
    }
}
