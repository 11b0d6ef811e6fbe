//! The shipped scenarios and templates folder stay valid, and the checked-in schema is fresh.

use scenario_run::model::{self, LoadOptions};

#[test]
fn shipped_scenarios_are_valid() {
    let files = model::expand_paths(&["scenarios".to_string()]).unwrap();
    assert!(files.len() >= 20, "expected at least 20 scenario files, found {}", files.len());
    let opts = LoadOptions { today: scenario_run::config::today(), ..Default::default() };
    match model::load(&files, &opts) {
        Ok(loaded) => {
            let used: std::collections::BTreeSet<&str> = loaded
                .scenarios
                .iter()
                .flat_map(|s| s.setup.iter().chain(&s.steps).chain(&s.finally))
                .map(|st| st.kind.name)
                .collect();
            let missing: Vec<&str> = scenario_run::steps::registry::names().filter(|n| !used.contains(n)).collect();
            assert!(missing.is_empty(), "step kinds no shipped scenario uses: {missing:?}");
        }
        Err(diags) => panic!("{}", diags.iter().map(|d| d.render()).collect::<String>()),
    }
}

#[test]
fn checked_in_schema_is_fresh() {
    let on_disk =
        std::fs::read_to_string(scenario_run::schema::SCHEMA_PATH).expect("schema/scenario.schema.json is checked in");
    assert!(
        on_disk == scenario_run::schema::schema_text(),
        "schema/scenario.schema.json is stale: run `cargo run -- schema`"
    );
}
