//! Who may connect, and what they may do.
//!
//! Every accepted connection's peer credentials are read from the kernel
//! (`SO_PEERCRED`: the uid, gid and pid of the process that connected,
//! which it cannot forge) and judged before any request is served:
//!
//! * the daemon's own user and root may do everything;
//! * members of the configured readers group (`[access] readers`) may only
//!   read: tail streams without a durable consumer, list streams and
//!   executions, see the status, list and load checkpoints, list questions;
//! * members of any answerers group (`[access] answerers`) may read as
//!   readers do, and answer questions (`tether answer`);
//! * anyone else is refused.
//!
//! Group membership is the peer's primary gid, or its user name listed as a
//! member of the group. Users and groups are looked up through the system's
//! name services (NSS: `/etc/passwd` and `/etc/group`, LDAP, sssd, ...) at
//! every connection, so a change of membership applies at once. Those
//! lookups may wait on a network directory, so they run on a blocking
//! thread, and never for root or the daemon's own user, whose connections
//! are judged by uid alone.
//!
//! The socket's own mode and group (see [`crate::server::bind_with`]) decide
//! who can connect at all; this is the second gate behind it.

use std::fmt;

use tether_protocol::Request;
use tokio::net::UnixStream;
use uzers::os::unix::GroupExt;

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
    /// Reading, and answering questions: members of an answerers group.
    Answerer,
    /// Nothing: the connection is refused at once, before its Hello.
    Denied,
}

/// The rules for judging peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The daemon's own uid.
    pub owner: u32,
    /// The readers group's name or numeric gid, if one is configured.
    pub readers: Option<String>,
    /// The answerers groups' names or numeric gids.
    pub answerers: Vec<String>,
}

/// A judged peer: who it is and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its credentials; `None` when the kernel would not say (then it is
    /// denied).
    pub cred: Option<PeerCred>,
    /// What it may do.
    pub access: Access,
    /// Its user name, for messages, when the name services know it
    /// (looked up only for peers other than root and the owner).
    pub user: Option<String>,
}

/// A group as the name services describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    /// Its gid.
    pub gid: u32,
    /// The users listed as its members (not those whose primary group it is).
    pub members: Vec<String>,
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
            answerers: Vec::new(),
        }
    }

    /// This policy with the answerers groups (`[access] answerers`).
    pub fn with_answerers(mut self, answerers: Vec<String>) -> Self {
        self.answerers = answerers;
        self
    }

    /// True for root and the daemon's own user: they may do everything,
    /// and no connection limit per uid applies to them.
    pub fn is_privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner
    }

    /// Reads the credentials of `stream`'s peer and judges them.
    pub async fn identify(&self, stream: &UnixStream) -> Peer {
        let cred = match stream.peer_cred() {
            Ok(cred) => PeerCred {
                uid: cred.uid(),
                gid: cred.gid(),
                // Linux always reports the pid; 0 stands for unknown.
                pid: cred.pid().unwrap_or(0),
            },
            Err(e) => {
                tracing::warn!("cannot read the credentials of a connecting peer: {e}");
                return Peer::unknown();
            }
        };
        if self.is_privileged(cred.uid) {
            return Peer {
                cred: Some(cred),
                access: Access::Full,
                user: None,
            };
        }
        let policy = self.clone();
        match tokio::task::spawn_blocking(move || policy.look_up(cred)).await {
            Ok(peer) => peer,
            Err(e) => {
                tracing::warn!("judging uid {} failed: {e}", cred.uid);
                Peer::unknown()
            }
        }
    }

    /// Judges `cred` with what the name services say of its user and of
    /// the readers group. Blocks while they answer.
    fn look_up(&self, cred: PeerCred) -> Peer {
        let user = user_name(cred.uid);
        let readers = self.readers.as_deref().and_then(group_entry);
        let answerers: Vec<Option<GroupEntry>> =
            self.answerers.iter().map(|g| group_entry(g)).collect();
        let access = match self.is_answerer(&cred, user.as_deref(), &answerers) {
            true => Access::Answerer,
            false => self.judge(&cred, user.as_deref(), readers.as_ref()),
        };
        Peer {
            cred: Some(cred),
            access,
            user,
        }
    }

    /// What a peer with `cred` (whose user name is `user`) may do, given
    /// the readers group's entry (`None` when it has none).
    pub fn judge(&self, cred: &PeerCred, user: Option<&str>, entry: Option<&GroupEntry>) -> Access {
        if self.is_privileged(cred.uid) {
            return Access::Full;
        }
        let Some(readers) = &self.readers else {
            return Access::Denied;
        };
        if in_group(readers, entry, cred.gid, user) {
            Access::ReadOnly
        } else {
            Access::Denied
        }
    }

    /// True when `cred` (whose user name is `user`) is in one of the
    /// answerers groups, whose entries are `entries`, in the same order.
    pub fn is_answerer(
        &self,
        cred: &PeerCred,
        user: Option<&str>,
        entries: &[Option<GroupEntry>],
    ) -> bool {
        !self.is_privileged(cred.uid)
            && self
                .answerers
                .iter()
                .zip(entries)
                .any(|(group, entry)| in_group(group, entry.as_ref(), cred.gid, user))
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
    /// A peer whose credentials could not be read: it is denied.
    fn unknown() -> Self {
        Peer {
            cred: None,
            access: Access::Denied,
            user: None,
        }
    }

    /// `Ok` when this peer may send `request`; otherwise the sentence
    /// saying why not.
    pub fn permits(&self, request: &Request) -> Result<(), String> {
        if self.access == Access::Answerer && matches!(request, Request::Answer(_)) {
            return Ok(());
        }
        self.permits_if(is_read(request), || describe(request))
    }

    /// [`Peer::permits`] for appends, which a session reads in batches
    /// rather than as [`Request`]s.
    pub fn permits_appends(&self) -> Result<(), String> {
        self.permits_if(false, || "Append".to_owned())
    }

    /// [`Peer::permits`] for a request of which only the kind (its variant
    /// index) has arrived: refused when no request of that kind is a read,
    /// so that its body need not be read at all. A kind this build does not
    /// know is no read either.
    pub fn permits_kind(&self, kind: u32) -> Result<(), String> {
        let name = Request::kind_name(kind);
        if self.access == Access::Answerer && name == Some("Answer") {
            return Ok(());
        }
        self.permits_if(name.is_some_and(may_be_read), || match name {
            Some(name) => name.to_owned(),
            None => format!("request type {kind}, unknown to this daemon,"),
        })
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
            Access::Answerer if read => Ok(()),
            Access::Answerer => Err(format!(
                "permission denied: {self} is in an answerers group and may only answer \
                 questions and read; {} is refused",
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
    may_be_read(request.name())
        && match request {
            Request::Subscribe(s) => s.consumer.is_none(),
            Request::DurableResume(r) => r.consumer.is_none(),
            _ => true,
        }
}

/// True for the requests (named by [`Request::name`]) of which some or all
/// change nothing: those a reader may send, depending on their fields.
fn may_be_read(name: &str) -> bool {
    matches!(
        name,
        "Hello"
            | "ListStreams"
            | "Status"
            | "Storage"
            | "Metrics"
            | "MirrorStatus"
            | "ListExecutions"
            | "ListExecutionsFull"
            | "CheckpointList"
            | "CheckpointLoad"
            | "StepGet"
            | "StepList"
            | "CheckpointLoadFull"
            | "CheckpointListFull"
            | "ListQuestions"
            | "Subscribe"
            | "DurableResume"
    )
}

/// True for requests that act on the daemon's state in a way worth a log
/// line naming who did it (appends and acks are logged once per session by
/// the caller, not per frame).
pub fn is_control(request: &Request) -> bool {
    matches!(
        request,
        Request::Run(_)
            | Request::RunFull(_)
            | Request::Stop { .. }
            | Request::Resume { .. }
            | Request::Restart { .. }
            | Request::CheckpointSave(_)
            | Request::StepPut { .. }
            | Request::StepClear { .. }
            | Request::CheckpointSaveFull(_)
            | Request::Append(_)
            | Request::AppendStamped(_)
            | Request::DurableAck(_)
            | Request::Remove { .. }
            | Request::Prune { .. }
            | Request::RemoveStreams { .. }
            | Request::Ask(_)
            | Request::Answer(_)
            | Request::Send { .. }
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

/// True when `gid` is the group `group` (a name or a numeric gid, whose
/// entry is `entry`), or `user` is listed as a member of it.
fn in_group(group: &str, entry: Option<&GroupEntry>, gid: u32, user: Option<&str>) -> bool {
    if group.parse::<u32>() == Ok(gid) {
        return true;
    }
    entry.is_some_and(|entry| {
        entry.gid == gid || user.is_some_and(|user| entry.members.iter().any(|m| m == user))
    })
}

/// The name of `uid`, if the name services know it. Blocks while they
/// answer.
pub fn user_name(uid: u32) -> Option<String> {
    uzers::get_user_by_uid(uid).map(|user| user.name().to_string_lossy().into_owned())
}

/// The entry of `group`, a name or a numeric gid, if the name services
/// know it.
pub fn group_entry(group: &str) -> Option<GroupEntry> {
    let found = match group.parse::<u32>() {
        Ok(gid) => uzers::get_group_by_gid(gid),
        Err(_) => uzers::get_group_by_name(group),
    }?;
    Some(GroupEntry {
        gid: found.gid(),
        members: found
            .members()
            .iter()
            .map(|m| m.to_string_lossy().into_owned())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::{StartAt, Subscribe};

    /// The readers group as the name services would describe it.
    fn readers() -> Option<GroupEntry> {
        Some(GroupEntry {
            gid: 1600,
            members: vec!["carol".to_owned()],
        })
    }

    fn policy(readers: Option<&str>) -> Policy {
        Policy {
            owner: 1000,
            readers: readers.map(str::to_owned),
            answerers: Vec::new(),
        }
    }

    fn cred(uid: u32, gid: u32) -> PeerCred {
        PeerCred { uid, gid, pid: 42 }
    }

    #[test]
    fn the_owner_and_root_may_do_everything() {
        let p = policy(None);
        assert_eq!(p.judge(&cred(1000, 1000), None, None), Access::Full);
        assert_eq!(p.judge(&cred(0, 0), Some("root"), None), Access::Full);
    }

    #[test]
    fn without_a_readers_group_everyone_else_is_denied() {
        let p = policy(None);
        assert_eq!(
            p.judge(&cred(1001, 1600), Some("carol"), readers().as_ref()),
            Access::Denied
        );
    }

    #[test]
    fn readers_are_members_by_primary_gid_or_by_listing() {
        let p = policy(Some("readers"));
        let entry = readers();
        let entry = entry.as_ref();
        assert_eq!(
            p.judge(&cred(1001, 1001), Some("carol"), entry),
            Access::ReadOnly
        );
        assert_eq!(
            p.judge(&cred(1002, 1600), Some("dave"), entry),
            Access::ReadOnly
        );
        assert_eq!(
            p.judge(&cred(1003, 1500), Some("alice"), entry),
            Access::Denied
        );
        // A numeric gid counts by primary gid even without an entry.
        let by_gid = policy(Some("1600"));
        assert_eq!(
            by_gid.judge(&cred(1002, 1600), None, None),
            Access::ReadOnly
        );
        assert_eq!(
            by_gid.judge(&cred(1001, 1001), Some("carol"), entry),
            Access::ReadOnly
        );
        // A group the name services do not know has no members.
        assert_eq!(
            p.judge(&cred(1001, 1001), Some("carol"), None),
            Access::Denied
        );
    }

    #[test]
    fn a_member_of_another_group_is_not_a_reader() {
        let p = policy(Some("readers"));
        assert_eq!(
            p.judge(&cred(1004, 1004), Some("bob"), readers().as_ref()),
            Access::Denied
        );
    }

    #[test]
    fn answerers_are_members_of_any_listed_group_and_may_answer_and_read() {
        let mut p = policy(Some("readers"));
        p.answerers = vec!["ops".into(), "1700".into()];
        let ops = Some(GroupEntry {
            gid: 1650,
            members: vec!["erin".into()],
        });
        let entries = [ops, None];
        assert!(p.is_answerer(&cred(1005, 1005), Some("erin"), &entries));
        assert!(p.is_answerer(&cred(1006, 1700), None, &entries));
        assert!(!p.is_answerer(&cred(1001, 1001), Some("carol"), &entries));
        assert!(
            !p.is_answerer(&cred(1000, 1650), None, &entries),
            "the owner is more"
        );

        let answerer = Peer {
            cred: Some(cred(1005, 1005)),
            access: Access::Answerer,
            user: Some("erin".into()),
        };
        let answer = Request::Answer(tether_protocol::AnswerSpec {
            execution: "e".into(),
            question: None,
            answer: "yes".into(),
        });
        assert!(answerer.permits(&answer).is_ok());
        assert!(answerer.permits_kind(answer.kind()).is_ok());
        let list = Request::ListQuestions {
            all: true,
            execution: None,
            after: 0,
            wait_ms: 0,
        };
        assert!(answerer.permits(&list).is_ok());
        assert!(answerer.permits(&Request::Status).is_ok());
        let send = Request::Send {
            execution: "e".into(),
            message: bytes::Bytes::from_static(b"hi"),
        };
        assert_eq!(
            answerer.permits(&send).unwrap_err(),
            "permission denied: uid 1005 (erin) is in an answerers group and may only answer \
             questions and read; Send is refused"
        );
        // A reader may list questions, not answer them.
        let reader = Peer {
            access: Access::ReadOnly,
            ..answerer
        };
        assert!(reader.permits(&list).is_ok());
        assert!(reader.permits(&answer).is_err());
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
        for new_attempt in [
            Request::Resume {
                execution: "e".into(),
                checkpoint: None,
            },
            Request::Restart {
                execution: "e".into(),
                timeout_ms: 1,
            },
        ] {
            let why = reader.permits(&new_attempt).unwrap_err();
            assert!(why.contains("may only read"), "{why}");
            assert!(reader.permits_kind(new_attempt.kind()).is_err());
        }
    }

    /// A reader is refused by the kind of a request alone, before its
    /// body arrives, with the words a whole request of that kind gets.
    #[test]
    fn readers_are_refused_by_kind_as_by_request() {
        let reader = Peer {
            cred: Some(cred(1001, 1600)),
            access: Access::ReadOnly,
            user: Some("carol".into()),
        };
        let stop = Request::Stop {
            execution: "e".into(),
            timeout_ms: 1,
        };
        assert_eq!(reader.permits_kind(stop.kind()), reader.permits(&stop));
        assert!(reader.permits_kind(Request::APPEND_KIND).is_err());
        let execution = || "e".to_owned();
        for read in [
            Request::Status,
            Request::ListStreams,
            Request::StepList {
                execution: execution(),
            },
            Request::CheckpointLoadFull {
                execution: execution(),
                schema_version: None,
            },
            Request::CheckpointListFull {
                execution: execution(),
            },
            Request::Metrics,
        ] {
            assert_eq!(reader.permits_kind(read.kind()), Ok(()));
            assert_eq!(reader.permits(&read), Ok(()));
        }
        let clear = Request::StepClear {
            execution: execution(),
            steps: vec![],
            all: true,
        };
        // Removing is the owner's and root's alone.
        for remove in [
            Request::Remove {
                executions: vec![execution()],
                force: false,
            },
            Request::Prune {
                older_than_ms: None,
            },
            Request::RemoveStreams {
                names: vec![execution()],
            },
        ] {
            assert!(reader.permits_kind(remove.kind()).is_err());
            assert!(reader.permits(&remove).is_err());
        }
        let save = Request::CheckpointSaveFull(tether_protocol::CheckpointSaveFull {
            execution: execution(),
            schema_version: 1,
            data: Default::default(),
            user_meta: vec![],
            force: false,
        });
        for write in [clear, save] {
            assert!(reader.permits_kind(write.kind()).is_err(), "{write:?}");
            assert!(reader.permits(&write).is_err(), "{write:?}");
        }
        // Whether a subscription is a read depends on its fields.
        assert_eq!(reader.permits_kind(2), Ok(()));
        let unknown = <Request as tether_protocol::Message>::KINDS;
        let why = reader.permits_kind(unknown).unwrap_err();
        assert!(
            why.contains(&format!("request type {unknown}, unknown")),
            "{why}"
        );
        let owner = Peer {
            access: Access::Full,
            ..reader
        };
        assert_eq!(owner.permits_kind(Request::APPEND_KIND), Ok(()));
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
    fn names_come_from_the_name_services() {
        // Every system knows root, and its group by both name and gid.
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(group_entry("root").map(|g| g.gid), Some(0));
        assert_eq!(group_entry("0").map(|g| g.gid), Some(0));
        assert_eq!(group_entry("no-such-group-for-tether"), None);
    }

    #[tokio::test]
    async fn the_peer_of_a_socket_pair_is_ourselves_with_full_access() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = Policy::for_this_process(None);
        let peer = me.identify(&a).await;
        let cred = peer.cred.unwrap();
        assert_eq!(cred.uid, tether_protocol::paths::current_uid());
        assert_eq!(cred.pid, i32::try_from(std::process::id()).unwrap());
        assert_eq!(peer.access, Access::Full);
    }

    #[test]
    fn other_peers_are_judged_through_the_name_services() {
        // Nobody has this uid: no name, and no readers group to be in.
        let stranger = cred(4_000_000_000, 4_000_000_000);
        let peer = policy(None).look_up(stranger);
        assert_eq!((peer.access, peer.user), (Access::Denied, None));
        // The group "root" is found by name: gid 0 is in it.
        let peer = policy(Some("root")).look_up(cred(4_000_000_000, 0));
        assert_eq!(peer.access, Access::ReadOnly);
    }
}
