//! Who may connect, and what they may do.
//!
//! Every accepted connection's peer credentials are read from the kernel
//! (`SO_PEERCRED`: the uid, gid and pid of the process that connected,
//! which it cannot forge) and judged before any request is served:
//!
//! * the daemon's own user and root may do everything;
//! * members of the configured readers group (`[access] readers`) may only
//!   read: tail streams without a durable consumer, list streams and
//!   executions, see the status, list and load checkpoints;
//! * anyone else is refused.
//!
//! Group membership is the peer's primary gid, or its user name listed as a
//! member of the group in `/etc/group` (read at every connection, so a
//! change of membership applies at once). Groups known only to other name
//! services (LDAP) count through the primary gid alone.
//!
//! The socket's own mode and group (see [`crate::server::bind_with`]) decide
//! who can connect at all; this is the second gate behind it.

use std::fmt;
use std::io;
use std::os::fd::AsRawFd;

use tether_protocol::Request;
use tokio::net::UnixStream;

/// The identity of the process at the other end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Its effective user id.
    pub uid: u32,
    /// Its effective (primary) group id.
    pub gid: u32,
    /// Its process id at connect time.
    pub pid: i32,
}

/// What a peer may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everything: the daemon's own user and root.
    Full,
    /// Reading only: members of the readers group.
    ReadOnly,
    /// Nothing: the connection is refused after its Hello.
    Denied,
}

/// The rules for judging peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The daemon's own uid.
    pub owner: u32,
    /// The readers group's name or numeric gid, if one is configured.
    pub readers: Option<String>,
}

/// A judged peer: who it is and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its credentials; `None` when the kernel would not say (then it is
    /// denied).
    pub cred: Option<PeerCred>,
    /// What it may do.
    pub access: Access,
    /// Its user name, for messages, when `/etc/passwd` knows it.
    pub user: Option<String>,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.cred, &self.user) {
            (Some(cred), Some(user)) => write!(f, "uid {} ({user})", cred.uid),
            (Some(cred), None) => write!(f, "uid {}", cred.uid),
            (None, _) => f.write_str("a peer of unknown identity"),
        }
    }
}

impl Policy {
    /// The policy of a daemon running as the current user.
    pub fn for_this_process(readers: Option<String>) -> Self {
        Self {
            owner: tether_protocol::paths::current_uid(),
            readers,
        }
    }

    /// Reads the credentials of `stream`'s peer and judges them.
    pub fn identify(&self, stream: &UnixStream) -> Peer {
        match peer_cred(stream) {
            Ok(cred) => {
                let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
                let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
                let user = user_name(&passwd, cred.uid);
                let access = self.judge(&cred, user.as_deref(), &groups);
                Peer {
                    cred: Some(cred),
                    access,
                    user,
                }
            }
            Err(e) => {
                tracing::warn!("cannot read the credentials of a connecting peer: {e}");
                Peer {
                    cred: None,
                    access: Access::Denied,
                    user: None,
                }
            }
        }
    }

    /// What a peer with `cred` (whose user name is `user`) may do, given
    /// the contents of `/etc/group`.
    pub fn judge(&self, cred: &PeerCred, user: Option<&str>, etc_group: &str) -> Access {
        if cred.uid == 0 || cred.uid == self.owner {
            return Access::Full;
        }
        let Some(readers) = &self.readers else {
            return Access::Denied;
        };
        if in_group(readers, cred.gid, user, etc_group) {
            Access::ReadOnly
        } else {
            Access::Denied
        }
    }

    /// The sentence a refused peer is told.
    pub fn denial(&self, peer: &Peer) -> String {
        let readers = match &self.readers {
            Some(group) => format!(" and members of the readers group {group:?}"),
            None => String::new(),
        };
        format!(
            "permission denied: {peer} may not use this daemon; it serves its owner \
             (uid {}), root{readers}",
            self.owner
        )
    }
}

impl Peer {
    /// `Ok` when this peer may send `request`; otherwise the sentence
    /// saying why not.
    pub fn permits(&self, request: &Request) -> Result<(), String> {
        self.permits_if(is_read(request), || describe(request))
    }

    /// [`Peer::permits`] for appends, which a session reads in batches
    /// rather than as [`Request`]s.
    pub fn permits_appends(&self) -> Result<(), String> {
        self.permits_if(false, || "Append".to_owned())
    }

    /// `read`: the request changes nothing; `what`: how a refusal names it.
    fn permits_if(&self, read: bool, what: impl FnOnce() -> String) -> Result<(), String> {
        match self.access {
            Access::Full => Ok(()),
            Access::ReadOnly if read => Ok(()),
            Access::ReadOnly => Err(format!(
                "permission denied: {self} is in the readers group and may only read \
                 (tail without --consumer, streams, ps, status, checkpoint list/load); \
                 {} is refused",
                what()
            )),
            Access::Denied => Err(format!("permission denied: {self} may not use this daemon")),
        }
    }

    /// The peer's pid, or 0 when unknown (for logs).
    pub fn pid(&self) -> i32 {
        self.cred.map_or(0, |c| c.pid)
    }

    /// The peer's uid, or `u32::MAX` when unknown (for logs).
    pub fn uid(&self) -> u32 {
        self.cred.map_or(u32::MAX, |c| c.uid)
    }
}

/// True for requests that change nothing. A subscription with a durable
/// consumer is not one: it records the consumer, whose acks then hold back
/// compaction.
fn is_read(request: &Request) -> bool {
    match request {
        Request::Hello(_)
        | Request::ListStreams
        | Request::Status
        | Request::Storage
        | Request::ListExecutions { .. }
        | Request::CheckpointList { .. }
        | Request::CheckpointLoad { .. }
        | Request::StepGet { .. } => true,
        Request::Subscribe(s) => s.consumer.is_none(),
        Request::DurableResume(r) => r.consumer.is_none(),
        _ => false,
    }
}

/// True for requests that act on the daemon's state in a way worth a log
/// line naming who did it (appends and acks are logged once per session by
/// the caller, not per frame).
pub fn is_control(request: &Request) -> bool {
    matches!(
        request,
        Request::Run(_)
            | Request::Stop { .. }
            | Request::CheckpointSave(_)
            | Request::StepPut { .. }
            | Request::Append(_)
            | Request::DurableAck(_)
    )
}

/// A request as named in a refusal.
fn describe(request: &Request) -> String {
    match request {
        Request::Subscribe(_) | Request::DurableResume(_) => {
            "reading as a durable consumer (--consumer), which stores acks,".to_owned()
        }
        other => other.name().to_owned(),
    }
}

/// True when `gid` is the group `group` (a name or a numeric gid), or
/// `user` is listed as a member of it in `etc_group`.
fn in_group(group: &str, gid: u32, user: Option<&str>, etc_group: &str) -> bool {
    if group.parse::<u32>() == Ok(gid) {
        return true;
    }
    etc_group.lines().any(|line| {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(id), members) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        let named = name == group || id == group;
        let primary = id.parse::<u32>() == Ok(gid);
        let listed = user.is_some_and(|user| {
            members.is_some_and(|m| m.split(',').any(|member| member.trim() == user))
        });
        named && (primary || listed)
    })
}

/// The name of `uid` in `etc_passwd`, if listed.
fn user_name(etc_passwd: &str, uid: u32) -> Option<String> {
    etc_passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid).then(|| name.to_owned())
    })
}

/// The credentials the kernel recorded when the peer connected.
#[allow(unsafe_code)]
pub fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(|_| io::Error::other("struct ucred does not fit in socklen_t"))?;
    // SAFETY: the descriptor is open for the lifetime of `stream`, `cred`
    // is a valid, writable `ucred`, and `len` holds its exact size, which
    // is what SO_PEERCRED writes at most.
    let ret = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        uid: cred.uid,
        gid: cred.gid,
        pid: cred.pid,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::{StartAt, Subscribe};

    const GROUP: &str = "root:x:0:\nops:x:1500:alice,bob\nreaders:x:1600:carol\n";

    fn policy(readers: Option<&str>) -> Policy {
        Policy {
            owner: 1000,
            readers: readers.map(str::to_owned),
        }
    }

    fn cred(uid: u32, gid: u32) -> PeerCred {
        PeerCred { uid, gid, pid: 42 }
    }

    #[test]
    fn the_owner_and_root_may_do_everything() {
        let p = policy(None);
        assert_eq!(p.judge(&cred(1000, 1000), None, GROUP), Access::Full);
        assert_eq!(p.judge(&cred(0, 0), Some("root"), GROUP), Access::Full);
    }

    #[test]
    fn without_a_readers_group_everyone_else_is_denied() {
        let p = policy(None);
        assert_eq!(
            p.judge(&cred(1001, 1600), Some("carol"), GROUP),
            Access::Denied
        );
    }

    #[test]
    fn readers_are_members_by_primary_gid_or_by_listing() {
        let p = policy(Some("readers"));
        assert_eq!(
            p.judge(&cred(1001, 1001), Some("carol"), GROUP),
            Access::ReadOnly
        );
        assert_eq!(
            p.judge(&cred(1002, 1600), Some("dave"), GROUP),
            Access::ReadOnly
        );
        assert_eq!(
            p.judge(&cred(1003, 1500), Some("alice"), GROUP),
            Access::Denied
        );
        let by_gid = policy(Some("1600"));
        assert_eq!(by_gid.judge(&cred(1002, 1600), None, ""), Access::ReadOnly);
        assert_eq!(
            by_gid.judge(&cred(1001, 1001), Some("carol"), GROUP),
            Access::ReadOnly
        );
    }

    #[test]
    fn a_member_of_another_group_is_not_a_reader() {
        let p = policy(Some("readers"));
        assert_eq!(
            p.judge(&cred(1004, 1004), Some("bob"), GROUP),
            Access::Denied
        );
    }

    #[test]
    fn readers_may_read_but_not_act() {
        let reader = Peer {
            cred: Some(cred(1001, 1600)),
            access: Access::ReadOnly,
            user: Some("carol".into()),
        };
        let tail = Request::Subscribe(Subscribe {
            stream: "s".into(),
            start: StartAt::Oldest,
            follow: true,
            consumer: None,
        });
        assert!(reader.permits(&tail).is_ok());
        assert!(reader.permits(&Request::Status).is_ok());
        assert!(reader
            .permits(&Request::ListExecutions { all: true })
            .is_ok());
        let as_consumer = Request::Subscribe(Subscribe {
            stream: "s".into(),
            start: StartAt::ConsumerAck,
            follow: true,
            consumer: Some("c".into()),
        });
        let why = reader.permits(&as_consumer).unwrap_err();
        assert!(why.contains("--consumer"), "{why}");
        let stop = Request::Stop {
            execution: "e".into(),
            timeout_ms: 1,
        };
        let why = reader.permits(&stop).unwrap_err();
        assert!(why.contains("uid 1001 (carol)"), "{why}");
        assert!(why.contains("may only read"), "{why}");
    }

    #[test]
    fn the_denial_names_the_peer_and_who_is_served() {
        let p = policy(Some("readers"));
        let peer = Peer {
            cred: Some(cred(1005, 1005)),
            access: Access::Denied,
            user: Some("eve".into()),
        };
        assert_eq!(
            p.denial(&peer),
            "permission denied: uid 1005 (eve) may not use this daemon; it serves its \
             owner (uid 1000), root and members of the readers group \"readers\""
        );
    }

    #[test]
    fn user_names_come_from_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\ncarol:x:1001:1001::/home/carol:/bin/sh\n";
        assert_eq!(user_name(passwd, 1001).as_deref(), Some("carol"));
        assert_eq!(user_name(passwd, 7), None);
    }

    #[tokio::test]
    async fn peer_credentials_of_a_socket_pair_are_our_own() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        assert_eq!(cred.uid, tether_protocol::paths::current_uid());
        assert_eq!(cred.pid, i32::try_from(std::process::id()).unwrap());
    }
}
