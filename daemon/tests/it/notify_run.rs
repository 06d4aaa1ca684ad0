//! The daemon in-process under a stand-in service manager: readiness and
//! stopping notifications, an inherited socket, and config reloads.

use std::os::unix::net::{UnixDatagram, UnixListener};
use std::time::Duration;

use tetherd::activation::Activated;
use tetherd::notify::Notifier;
use tetherd::{Config, Launch};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

/// Reads datagrams (on a blocking thread) until one holds `line`; every
/// datagram read on the way is in the panic message when none does.
async fn wait_for(socket: &UnixDatagram, line: &'static str) {
    let socket = socket.try_clone().unwrap();
    tokio::task::spawn_blocking(move || {
        socket.set_read_timeout(Some(WAIT)).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = socket
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no {line} arrived ({e}); before it: {seen:?}"));
            let datagram = String::from_utf8_lossy(&buf[..n]).into_owned();
            if datagram.lines().any(|l| l == line) {
                return;
            }
            seen.push(datagram);
        }
    })
    .await
    .unwrap();
}

/// Every datagram already queued on `socket`, without waiting.
fn queued(socket: &UnixDatagram) -> Vec<String> {
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let mut all = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        all.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_means_the_socket_accepts_and_stopping_comes_with_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let socket = dir.path().join("tether.sock");
    let config = Config::new(socket.clone(), dir.path().join("state"));
    let launch = Launch {
        notifier: Some(Notifier::connect(notify_path.to_str().unwrap()).unwrap()),
        ..Launch::default()
    };
    let token = CancellationToken::new();
    let task = tokio::spawn(tetherd::run_with(config, token.clone(), launch));

    wait_for(&notify, "READY=1").await;
    std::os::unix::net::UnixStream::connect(&socket).expect("READY=1 before the socket accepted");
    token.cancel();
    // The daemon has stopped before STOPPING=1 is looked for, so that a
    // daemon slow to stop and a missing notice fail apart.
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the daemon did not stop within 30 s of its shutdown")
        .unwrap()
        .unwrap();
    let after_ready = queued(&notify);
    assert!(
        after_ready
            .iter()
            .any(|d| d.lines().any(|l| l == "STOPPING=1")),
        "no STOPPING=1 among {after_ready:?}"
    );
    assert!(
        !socket.exists(),
        "a socket the daemon bound is removed on exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_socket_is_served_and_left_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("inherited.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    // The configured path differs: the inherited socket wins.
    let config = Config::new(dir.path().join("unused.sock"), dir.path().join("state"));
    let (reload_tx, reloads) = tokio::sync::mpsc::unbounded_channel();
    let launch = Launch {
        activated: Some(Activated {
            listener,
            path: Some(socket.clone()),
        }),
        reloads: Some(reloads),
        ..Launch::default()
    };
    let token = CancellationToken::new();
    let task = tokio::spawn(tetherd::run_with(config.clone(), token.clone(), launch));

    std::os::unix::net::UnixStream::connect(&socket).unwrap();
    // A reload that changes what needs a restart is logged, not fatal.
    let mut reloaded = config;
    reloaded.max_connections = 3;
    reloaded.retention.max_frames = Some(5);
    reload_tx.send(reloaded).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "a reload stopped the daemon");

    token.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(socket.exists(), "the inherited socket's file was removed");
    assert!(!dir.path().join("unused.sock").exists());
}
