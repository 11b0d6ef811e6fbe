//! Issue 35 ("the proxy has an idle timeout and a per-sandbox connection cap that admission
//! counts"): sandboxes' networks hold the runner's (or serve's) descriptors on their behalf, up
//! to their caps; creates and policy updates are admitted against the process's descriptor
//! limit, so the sandboxes together can never take the descriptors the process needs (before,
//! about twenty sandboxes with a name policy could exhaust serve).
//!
//! This file holds one test: it lowers its own process's `RLIMIT_NOFILE` (nextest runs each
//! test in a process of its own). Needs what the local provider needs (root, bwrap).

use scenario_run::provider::caps::NetworkControl;
use scenario_run::provider::local::{Isolation, LocalOptions, LocalProvider};
use scenario_run::provider::{CreateRequest, ErrorKind, NetworkPolicy, Provider};

/// A sandbox's network, at worst, and its proxy with 64 connections (two descriptors each).
const NET: u64 = 104;
const PROXY: u64 = 128;

fn names() -> NetworkPolicy {
    NetworkPolicy {
        allow_out: vec!["registry.npmjs.org".into()],
        deny_out: vec!["0.0.0.0/0".into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn sandboxes_networks_are_admitted_against_the_descriptor_limit() {
    use rustix::process::{setrlimit, Resource, Rlimit};
    // 1,000 descriptors: 744 may be promised (a quarter, at least 256, is kept).
    setrlimit(Resource::Nofile, Rlimit { current: Some(1000), maximum: Some(1000) }).unwrap();
    std::env::set_var("SCENARIO_RUN_PROXY_CONNS", "64");
    for pool in ["SCENARIO_RUN_NET_POOL", "SCENARIO_RUN_SANDBOX_POOL"] {
        std::env::set_var(pool, "0");
    }
    let dir = tempfile::tempdir().unwrap();
    let opts =
        LocalOptions { state_dir: dir.path().to_path_buf(), isolation: Isolation::Namespaces, ..Default::default() };
    let p = LocalProvider::new(opts).expect("isolated sandboxes (needs root, bwrap)");

    let mut live = Vec::new();
    let refusal = loop {
        let r = p.create(CreateRequest { network: Some(names()), ..Default::default() }).await;
        match r {
            Ok(sb) => live.push(sb.id),
            Err(e) => break e,
        }
        assert!(
            live.len() <= 8,
            "eight sandboxes with a proxy of 64 connections each admitted under 1,000 descriptors"
        );
    };
    assert_eq!(refusal.kind, ErrorKind::Capacity, "{refusal}");
    assert!(refusal.message.contains("too many descriptors promised"), "{refusal}");
    assert!(refusal.message.contains("RLIMIT_NOFILE 1000"), "{refusal}");
    assert_eq!(live.len() as u64, 744 / (NET + PROXY), "as many as the promise allows: {refusal}");
    assert_eq!(p.list(&Default::default()).await.unwrap().len(), live.len(), "the refused create left nothing");

    // An open sandbox takes no proxy, but its network does not fit in what is left either
    // (744 - 3 × 232 = 48 < 104); killing one gives its network and proxy back.
    let e = p.create(CreateRequest::default()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    p.kill(&live.pop().unwrap()).await.unwrap();
    let open = p.create(CreateRequest::default()).await.unwrap();
    // 2 × 232 + 104 = 568, and a second open sandbox fits (672); a policy update that starts
    // one's proxy (128 more: 800) does not, and is refused as the create is, its policy kept.
    let second = p.create(CreateRequest::default()).await.unwrap();
    let e = p.update_network(&open.id, names()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("egress proxy"), "{e}");
    p.kill(&second.id).await.unwrap();
    p.update_network(&open.id, names()).await.unwrap();
    let mut both = vec![open.id.clone()];
    both.extend(live);
    for id in both {
        p.kill(&id).await.unwrap();
    }
}
