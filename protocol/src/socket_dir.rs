//! Whether a socket's directory can be trusted: the one check that both
//! `tetherd` (before it binds) and `tether` (before it connects) make.
//!
//! Whoever can write to the directory of a socket can put their own socket
//! in its place, and then receive everything a client sends (a daemon
//! impersonated) or serve clients in the daemon's place. So a directory is
//! refused when it is writable by anyone but its owner and root (group- or
//! other-writable). A default directory in a shared place
//! ([`paths::user_socket_dirs`]: `$XDG_RUNTIME_DIR/tether`,
//! `/tmp/tether-$UID`) is refused unless the user running the check owns
//! it: anyone can create `/tmp/tether-1000` before user 1000 does.
//!
//! [`check`] reads the directory's metadata; [`judge`] decides on it (and
//! reads `/etc/passwd` only to name users in its refusals). This module and [`paths::current_uid`] are the only
//! file system reads of this crate.

use std::fmt;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::paths::{self, Env};
use crate::{Error, Result};

/// Permission bits that let the group or others write.
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// What [`judge`] looks at: the directory's owner and mode (the symbolic
/// link followed), and the owner of the name itself (a symbolic link's own
/// owner, else the same as `owner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirFacts {
    pub owner: u32,
    pub mode: u32,
    pub name_owner: u32,
}

/// The directory a socket path is in (`.` for a bare name).
pub fn socket_dir(socket: &Path) -> &Path {
    match socket.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Checks the directory of `socket` for the user `env.uid`. `Ok(None)`:
/// the directory does not exist (for a client, no daemon; a daemon creates
/// it, then checks again). `Ok(Some(uid))`: it may be used, and `uid` owns
/// it. [`Error::UnsafeSocketDir`] when it must not be used; [`Error::Io`]
/// when it cannot be looked at.
pub fn check(socket: &Path, env: Env<'_>) -> Result<Option<u32>> {
    let dir = socket_dir(socket);
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let name_owner = std::fs::symlink_metadata(dir)?.uid();
    let facts = DirFacts {
        owner: meta.uid(),
        mode: meta.mode(),
        name_owner,
    };
    judge(dir, facts, env).map(Some)
}

/// The judgement of [`check`], on facts already read: the directory's
/// owner when it may be used.
pub fn judge(dir: &Path, facts: DirFacts, env: Env<'_>) -> Result<u32> {
    let owner = facts.owner;
    if facts.mode & WRITABLE_BY_OTHERS != 0 {
        return Err(refuse(
            dir,
            format!(
                "it is writable by users other than its owner, {}, and root (mode {:04o}); \
                 anyone who can write there can put a socket in the daemon's place",
                User::named(owner),
                facts.mode & 0o7777
            ),
        ));
    }
    let shared_place = paths::user_socket_dirs(env).iter().any(|d| d == dir);
    if shared_place && (owner != env.uid || facts.name_owner != env.uid) {
        let found = if owner != env.uid {
            owner
        } else {
            facts.name_owner
        };
        return Err(refuse(
            dir,
            format!(
                "it is owned by {}, not by {} who runs this; another user may have made it \
                 to catch the socket (remove it, or choose another socket path)",
                User::named(found),
                User::named(env.uid)
            ),
        ));
    }
    Ok(owner)
}

fn refuse(dir: &Path, why: String) -> Error {
    Error::UnsafeSocketDir {
        dir: dir.to_path_buf(),
        why,
    }
}

/// A user as messages name it: `uid 1000 (alice)`, or `uid 1000` when
/// `/etc/passwd` does not know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub name: Option<String>,
}

impl User {
    /// `uid` with its name from `/etc/passwd`, when there is one.
    pub fn named(uid: u32) -> Self {
        let name = std::fs::read_to_string("/etc/passwd")
            .ok()
            .and_then(|passwd| name_in_passwd(&passwd, uid));
        Self { uid, name }
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "uid {} ({name})", self.uid),
            None => write!(f, "uid {}", self.uid),
        }
    }
}

/// The name of `uid` in the text of an `/etc/passwd`.
fn name_in_passwd(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let found = fields.nth(1)?.parse::<u32>().ok()?;
        (found == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn judged(dir: &str, facts: DirFacts, uid: u32, xdg: Option<&str>) -> Result<u32> {
        let xdg = xdg.map(str::to_owned);
        let var = move |name: &str| (name == "XDG_RUNTIME_DIR").then(|| xdg.clone()).flatten();
        judge(Path::new(dir), facts, Env { var: &var, uid })
    }

    fn facts(owner: u32, mode: u32) -> DirFacts {
        DirFacts {
            owner,
            mode,
            name_owner: owner,
        }
    }

    #[test]
    fn a_directory_others_can_write_to_is_refused_whoever_owns_it() {
        for mode in [0o40777, 0o41777, 0o40770, 0o40702] {
            let err = judged("/srv/t", facts(0, mode), 1000, None).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with("refusing socket directory /srv/t: it is writable by users"),
                "{text}"
            );
            assert!(
                text.contains(&format!("(mode {:04o})", mode & 0o7777)),
                "{text}"
            );
        }
        assert_eq!(judged("/srv/t", facts(7, 0o40755), 1000, None).unwrap(), 7);
        assert_eq!(judged("/srv/t", facts(0, 0o40700), 1000, None).unwrap(), 0);
    }

    #[test]
    fn a_default_directory_must_belong_to_the_user() {
        let err = judged("/tmp/tether-1000", facts(1001, 0o40700), 1000, None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("refusing socket directory /tmp/tether-1000: it is owned by uid 1001"),
            "{text}"
        );
        assert!(text.contains("not by uid 1000"), "{text}");
        let xdg = Some("/run/user/1000");
        assert!(judged("/run/user/1000/tether", facts(0, 0o40700), 1000, xdg).is_err());
        assert_eq!(
            judged("/run/user/1000/tether", facts(1000, 0o40700), 1000, xdg).unwrap(),
            1000
        );
        // Another user's default directory is an ordinary one to root.
        assert_eq!(
            judged("/tmp/tether-1000", facts(1000, 0o40700), 0, None).unwrap(),
            1000
        );
        // A symbolic link someone else made is refused even when it points
        // at a directory of the user's.
        let linked = DirFacts {
            owner: 1000,
            mode: 0o40700,
            name_owner: 1001,
        };
        let text = judged("/tmp/tether-1000", linked, 1000, None)
            .unwrap_err()
            .to_string();
        assert!(text.contains("owned by uid 1001"), "{text}");
    }

    #[test]
    fn users_are_named_from_passwd_when_known() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/a:/bin/sh\n";
        assert_eq!(name_in_passwd(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(name_in_passwd(passwd, 0).as_deref(), Some("root"));
        assert_eq!(name_in_passwd(passwd, 5), None);
        let unknown = User { uid: 5, name: None };
        assert_eq!(unknown.to_string(), "uid 5");
    }

    #[test]
    fn a_missing_directory_is_not_an_error() {
        let var = |_: &str| None;
        let env = Env {
            var: &var,
            uid: 1000,
        };
        let missing = Path::new("/nonexistent-tether-dir/s.sock");
        assert_eq!(check(missing, env).unwrap(), None);
        assert_eq!(socket_dir(Path::new("s.sock")), Path::new("."));
    }
}
