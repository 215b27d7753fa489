//! The private ZooKeeper and etcd servers start, answer, survive the loss of one member of
//! three, come back on restart with their data, and leave no process behind when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use servers::etcd::http_request;
use servers::zookeeper::four_letter_word;
use servers::{EtcdCluster, EtcdServer, ZooKeeperEnsemble, ZooKeeperServer};

fn is_running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The `Zxid` that `srvr` reports on `port`: how many transactions the server has applied
/// (in this epoch).
fn zxid(port: u16) -> u64 {
    let srvr = four_letter_word(port, "srvr").expect("the server answers srvr");
    let hex = srvr
        .lines()
        .find_map(|line| line.strip_prefix("Zxid: 0x"))
        .expect("srvr reports a Zxid");
    u64::from_str_radix(hex.trim(), 16).expect("a hex Zxid")
}

/// Open a ZooKeeper session on `port` with the wire protocol's `ConnectRequest` and wait for
/// the answer: the server logs a `createSession` transaction before it answers.
fn open_session(port: u16) -> TcpStream {
    let mut request = Vec::new();
    request.extend_from_slice(&0_i32.to_be_bytes()); // protocolVersion
    request.extend_from_slice(&0_i64.to_be_bytes()); // lastZxidSeen
    request.extend_from_slice(&2_000_i32.to_be_bytes()); // timeOut (ms)
    request.extend_from_slice(&0_i64.to_be_bytes()); // sessionId: a new session
    request.extend_from_slice(&16_i32.to_be_bytes()); // passwd: 16 bytes
    request.extend_from_slice(&[0; 16]);
    request.push(0); // readOnly: false
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the server accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(&(request.len() as i32).to_be_bytes())
        .unwrap();
    stream.write_all(&request).unwrap();
    let mut length = [0; 4];
    stream.read_exact(&mut length).expect("a ConnectResponse");
    let mut response = vec![0; i32::from_be_bytes(length) as usize];
    stream.read_exact(&mut response).unwrap();
    let session = i64::from_be_bytes(response[8..16].try_into().unwrap());
    assert_ne!(session, 0, "the server granted a session");
    stream
}

#[test]
fn a_zookeeper_server_answers_and_keeps_its_data_across_a_restart() {
    let started = Instant::now();
    let mut server = ZooKeeperServer::start();
    eprintln!("ZooKeeperServer started in {:?}", started.elapsed());
    assert_eq!(
        server.connect_string(),
        format!("127.0.0.1:{}", server.port())
    );
    assert_eq!(
        four_letter_word(server.port(), "ruok").as_deref(),
        Some("imok")
    );
    assert_eq!(server.mode().as_deref(), Some("standalone"));
    assert_eq!(zxid(server.port()), 0, "a new server has applied nothing");

    drop(open_session(server.port()));
    let before = zxid(server.port());
    assert!(before > 0, "opening a session is a transaction");
    let (port, old_pid) = (server.port(), server.pid());
    server.kill();
    assert!(!is_running(old_pid));
    assert_eq!(four_letter_word(port, "ruok"), None);

    let restarted = Instant::now();
    server.restart();
    eprintln!("ZooKeeperServer restarted in {:?}", restarted.elapsed());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(
        zxid(server.port()) >= before,
        "the restarted server replayed its transaction log"
    );
}

#[test]
fn a_stopped_zookeeper_server_answers_again_once_continued() {
    let server = ZooKeeperServer::start();

    server.signal("-STOP");
    let stopped = four_letter_word(server.port(), "ruok");
    server.signal("-CONT");

    assert_eq!(stopped, None, "a stopped server does not answer");
    assert_eq!(
        four_letter_word(server.port(), "ruok").as_deref(),
        Some("imok")
    );
}

#[test]
fn dropping_a_zookeeper_server_leaves_no_process_behind() {
    let server = ZooKeeperServer::start();
    let pid = server.pid();
    assert!(is_running(pid));
    server.signal("-STOP");

    drop(server);

    assert!(!is_running(pid), "pid {pid} outlived its ZooKeeperServer");
}

/// A ZooKeeper ensemble of three keeps a leader without one member, and takes it back.
#[test]
fn a_zookeeper_ensemble_keeps_a_leader_while_one_member_is_down() {
    let started = Instant::now();
    let mut ensemble = ZooKeeperEnsemble::start(3);
    eprintln!("ZooKeeperEnsemble(3) formed in {:?}", started.elapsed());
    let ports = ensemble.member_ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(
        ensemble.connect_string(),
        ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let leader = ensemble.leader().expect("a formed ensemble has a leader");
    for i in (0..3).filter(|&i| i != leader) {
        assert_eq!(ensemble.mode(i).as_deref(), Some("follower"));
    }

    // The leader is the member whose loss asks the most: the others elect a new one.
    let old_pid = ensemble.pid(leader);
    ensemble.kill(leader);
    let elected = Instant::now();
    ensemble.wait_for_quorum(Duration::from_secs(30));
    eprintln!("the survivors elected a leader in {:?}", elected.elapsed());
    assert!(!is_running(old_pid));
    let new_leader = ensemble.leader().expect("the survivors have a leader");
    assert_ne!(new_leader, leader);
    assert_eq!(ensemble.mode(leader), None);

    let restarted = Instant::now();
    ensemble.restart(leader);
    eprintln!("the old leader rejoined in {:?}", restarted.elapsed());
    assert_eq!(ensemble.member_ports(), ports);
    assert_eq!(ensemble.mode(leader).as_deref(), Some("follower"));
    assert_eq!(ensemble.leader(), Some(new_leader));

    let pids: Vec<u32> = (0..3).map(|i| ensemble.pid(i)).collect();
    drop(ensemble);
    for pid in pids {
        assert!(!is_running(pid), "pid {pid} outlived its ZooKeeperEnsemble");
    }
}

/// `"testkit"` and `"kept"`, base64-encoded as etcd's JSON gateway wants keys and values.
const KEY: &str = "dGVzdGtpdA==";
const VALUE: &str = "a2VwdA==";

#[test]
fn an_etcd_server_is_healthy_and_keeps_its_data_across_a_restart() {
    let started = Instant::now();
    let mut server = EtcdServer::start();
    eprintln!("EtcdServer started in {:?}", started.elapsed());
    assert_eq!(
        server.endpoint(),
        format!("http://127.0.0.1:{}", server.port())
    );
    assert!(server.is_healthy());
    let health = http_request(server.port(), "GET", "/health", "").expect("GET /health");
    assert!(health.contains(r#""health":"true""#), "{health}");
    let put = format!(r#"{{"key":"{KEY}","value":"{VALUE}"}}"#);
    http_request(server.port(), "POST", "/v3/kv/put", &put).expect("a put");

    let (port, old_pid) = (server.port(), server.pid());
    server.kill();
    assert!(!is_running(old_pid));
    assert!(!server.is_healthy());
    let restarted = Instant::now();
    server.restart();
    eprintln!("EtcdServer restarted in {:?}", restarted.elapsed());

    assert_eq!(server.port(), port);
    let range = format!(r#"{{"key":"{KEY}"}}"#);
    let got = http_request(server.port(), "POST", "/v3/kv/range", &range).expect("a range");
    assert!(got.contains(VALUE), "the key survived the restart: {got}");
}

/// An etcd server stopped (SIGSTOP) is healthy again once continued, and dropping it ends
/// its process.
#[test]
fn a_continued_etcd_server_is_healthy_and_dropping_it_ends_it() {
    let server = EtcdServer::start();

    server.signal("-STOP");
    let stopped = server.is_healthy();
    server.signal("-CONT");
    assert!(!stopped, "a stopped server does not answer");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.is_healthy() {
        assert!(Instant::now() < deadline, "not healthy again after SIGCONT");
        std::thread::sleep(Duration::from_millis(50));
    }

    let pid = server.pid();
    server.signal("-STOP");
    drop(server);
    assert!(!is_running(pid), "pid {pid} outlived its EtcdServer");
}

#[test]
fn an_etcd_cluster_stays_healthy_without_one_member_and_takes_it_back() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::start(3);
    eprintln!("EtcdCluster(3) healthy in {:?}", started.elapsed());
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(
        endpoints,
        cluster
            .member_ports()
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
    );
    assert!((0..3).all(|i| cluster.is_healthy(i)));
    let leader = cluster.leader().expect("a healthy cluster has a leader");

    let old_pid = cluster.pid(leader);
    cluster.kill(leader);
    let elected = Instant::now();
    cluster.wait_until_healthy(Duration::from_secs(30));
    eprintln!(
        "the survivors were healthy again in {:?}",
        elected.elapsed()
    );
    assert!(!is_running(old_pid));
    assert!(!cluster.is_healthy(leader));
    let survivor = (leader + 1) % 3;
    assert!(cluster.is_healthy(survivor));
    let new_leader = cluster.leader().expect("the survivors have a leader");
    assert_ne!(new_leader, leader);

    let restarted = Instant::now();
    cluster.restart(leader);
    eprintln!("the old leader rejoined in {:?}", restarted.elapsed());
    assert_eq!(cluster.endpoints(), endpoints);
    assert!((0..3).all(|i| cluster.is_healthy(i)));

    let pids: Vec<u32> = (0..3).map(|i| cluster.pid(i)).collect();
    drop(cluster);
    for pid in pids {
        assert!(!is_running(pid), "pid {pid} outlived its EtcdCluster");
    }
}
