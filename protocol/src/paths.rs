//! Where the socket and the state directory are when no flag says.
//!
//! Both binaries resolve paths here so that `tetherd &` followed by
//! `tether ...` meets at the same socket with no flags. The functions take
//! the environment as a lookup closure so that they are pure and testable.

use std::path::PathBuf;

/// The environment as seen by the resolvers: a variable lookup and the uid.
#[derive(Clone, Copy)]
pub struct Env<'a> {
    pub var: &'a dyn Fn(&str) -> Option<String>,
    pub uid: u32,
}

impl std::fmt::Debug for Env<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env").field("uid", &self.uid).finish()
    }
}

impl Env<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|v| !v.is_empty())
    }
}

/// The process's real environment and effective uid.
pub fn from_process<R>(f: impl FnOnce(Env<'_>) -> R) -> R {
    let var = |name: &str| std::env::var(name).ok();
    f(Env {
        var: &var,
        uid: current_uid(),
    })
}

/// The effective uid of this process, read without `unsafe`: `/proc/self`
/// is owned by it. Falls back to `$UID`-less `u32::MAX` ("not root") when
/// /proc is unavailable, which only changes which default path is chosen.
pub fn current_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Socket: `$TETHER_SOCKET`, else `$RUNTIME_DIRECTORY/tether.sock`, else
/// `/run/tether/tether.sock` for root, else `$XDG_RUNTIME_DIR/tether/tether.sock`,
/// else `/tmp/tether-$UID/tether.sock`. A `--socket` flag wins over all of
/// them and is applied by the caller.
pub fn default_socket(env: Env<'_>) -> PathBuf {
    if let Some(p) = env.get("TETHER_SOCKET") {
        return PathBuf::from(p);
    }
    if let Some(dir) = env.get("RUNTIME_DIRECTORY") {
        // systemd may pass several colon-separated directories; ours is first.
        let first = dir.split(':').next().unwrap_or(&dir).to_owned();
        return PathBuf::from(first).join("tether.sock");
    }
    if env.uid == 0 {
        return PathBuf::from("/run/tether/tether.sock");
    }
    if let Some(dir) = xdg_socket_dir(env) {
        return dir.join("tether.sock");
    }
    tmp_socket_dir(env.uid).join("tether.sock")
}

/// The default socket directories that live where other users could have
/// made them first: `$XDG_RUNTIME_DIR/tether` (when set) and
/// `/tmp/tether-$UID`. Such a directory must belong to the user (see
/// [`crate::socket_dir`]).
pub fn user_socket_dirs(env: Env<'_>) -> Vec<PathBuf> {
    xdg_socket_dir(env)
        .into_iter()
        .chain([tmp_socket_dir(env.uid)])
        .collect()
}

fn xdg_socket_dir(env: Env<'_>) -> Option<PathBuf> {
    env.get("XDG_RUNTIME_DIR")
        .map(|dir| PathBuf::from(dir).join("tether"))
}

fn tmp_socket_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/tether-{uid}"))
}

/// State: `$TETHER_STATE_DIR`, else `$STATE_DIRECTORY`, else
/// `/var/lib/tether` for root, else `$XDG_STATE_HOME/tether`, else
/// `~/.local/state/tether`. `None` only when no home directory is known.
pub fn default_state_dir(env: Env<'_>) -> Option<PathBuf> {
    if let Some(p) = env.get("TETHER_STATE_DIR") {
        return Some(PathBuf::from(p));
    }
    if let Some(dir) = env.get("STATE_DIRECTORY") {
        let first = dir.split(':').next().unwrap_or(&dir).to_owned();
        return Some(PathBuf::from(first));
    }
    if env.uid == 0 {
        return Some(PathBuf::from("/var/lib/tether"));
    }
    if let Some(dir) = env.get("XDG_STATE_HOME") {
        return Some(PathBuf::from(dir).join("tether"));
    }
    env.get("HOME")
        .map(|home| PathBuf::from(home).join(".local/state/tether"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)], uid: u32) -> (PathBuf, Option<PathBuf>) {
        let owned: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let var = move |name: &str| {
            owned
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let env = Env { var: &var, uid };
        (default_socket(env), default_state_dir(env))
    }

    #[test]
    fn explicit_variables_win() {
        let (sock, state) = with(
            &[
                ("TETHER_SOCKET", "/x/s.sock"),
                ("TETHER_STATE_DIR", "/x/state"),
                ("RUNTIME_DIRECTORY", "/run/t"),
                ("STATE_DIRECTORY", "/var/lib/t"),
            ],
            0,
        );
        assert_eq!(sock, PathBuf::from("/x/s.sock"));
        assert_eq!(state, Some(PathBuf::from("/x/state")));
    }

    #[test]
    fn systemd_directories_come_next() {
        let (sock, state) = with(
            &[
                ("RUNTIME_DIRECTORY", "/run/t:/run/u"),
                ("STATE_DIRECTORY", "/var/lib/t"),
            ],
            1000,
        );
        assert_eq!(sock, PathBuf::from("/run/t/tether.sock"));
        assert_eq!(state, Some(PathBuf::from("/var/lib/t")));
    }

    #[test]
    fn root_uses_system_paths() {
        let (sock, state) = with(&[("XDG_RUNTIME_DIR", "/run/user/0")], 0);
        assert_eq!(sock, PathBuf::from("/run/tether/tether.sock"));
        assert_eq!(state, Some(PathBuf::from("/var/lib/tether")));
    }

    #[test]
    fn users_use_xdg_then_tmp_and_home() {
        let (sock, state) = with(
            &[
                ("XDG_RUNTIME_DIR", "/run/user/7"),
                ("XDG_STATE_HOME", "/h/st"),
            ],
            7,
        );
        assert_eq!(sock, PathBuf::from("/run/user/7/tether/tether.sock"));
        assert_eq!(state, Some(PathBuf::from("/h/st/tether")));
        let (sock, state) = with(&[("HOME", "/home/u")], 7);
        assert_eq!(sock, PathBuf::from("/tmp/tether-7/tether.sock"));
        assert_eq!(state, Some(PathBuf::from("/home/u/.local/state/tether")));
        let (_, state) = with(&[], 7);
        assert_eq!(state, None);
    }
}
