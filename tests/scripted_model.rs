//! Issue 14: the scripted model endpoint a run serves is reachable from inside a sandbox that
//! has only loopback (the provider's `expose_host`: a socket listening in the sandbox's network
//! namespace, spliced to the host), on the local provider and, with an engine, on docker.

mod common;

use common::*;

fn run_on(provider: &str) {
    let out = cmd(&["tests/fixtures/scripted-model/reach-it.yaml", "--no-progress", "--provider", provider])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{provider}: {}{}", text(&out.stdout), text(&out.stderr));
}

#[test]
fn the_scripted_model_answers_inside_a_local_sandbox() {
    run_on("local");
}

#[test]
fn the_scripted_model_answers_inside_a_docker_container() {
    if std::env::var("DOCKER_HOST").is_ok_and(|h| !h.is_empty()) {
        run_on("docker");
    } else {
        eprintln!("skipping: DOCKER_HOST is not set (run .ci/local-stack.sh up and source its env file)");
    }
}
