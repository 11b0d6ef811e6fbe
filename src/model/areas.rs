//! The CI matrix over scenario folders (`scenario-run matrix`): one entry per folder (area)
//! under a root that holds scenario files, optionally crossed with providers.

use serde_json::{json, Value};

use super::expand_paths;

/// The entries of the matrix, sorted, as `root/name`: each folder directly under `root` that
/// holds at least one scenario file (an area), and each scenario file directly in `root` (its
/// own entry: dropping it would leave it run by no job). Nothing to run is an error, not an
/// empty matrix (which would be a CI with no scenario job, and green).
pub fn folders(root: &str) -> Result<Vec<String>, String> {
    let dir = std::fs::read_dir(root).map_err(|e| format!("cannot read {root}: {e}"))?;
    let mut folders: Vec<String> = dir
        .flatten()
        .filter(|e| {
            let p = e.path();
            if p.is_dir() {
                expand_paths(&[p.to_string_lossy().into_owned()]).is_ok()
            } else {
                super::load::is_scenario_file(&p)
            }
        })
        .map(|e| format!("{root}/{}", e.file_name().to_string_lossy()))
        .collect();
    folders.sort();
    if folders.is_empty() {
        return Err(format!("no scenario files in {root} or the folders under it: the matrix would have no entry"));
    }
    Ok(folders)
}

/// GitHub Actions' `strategy.matrix` JSON: `{"include": [{area, path[, provider]}…]}`; the
/// area of a file at the top is its file name (`smoke.yaml`), so it never takes a folder's.
pub fn github_matrix(folders: &[String], providers: &[String]) -> Value {
    let mut include = Vec::new();
    for f in folders {
        let area = f.rsplit('/').next().unwrap_or(f);
        if providers.is_empty() {
            include.push(json!({ "area": area, "path": f }));
        }
        for p in providers {
            include.push(json!({ "area": area, "path": f, "provider": p }));
        }
    }
    json!({ "include": include })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_folder_and_provider() {
        let folders = vec!["s/commands".to_string(), "s/files".to_string()];
        assert_eq!(
            github_matrix(&folders, &[]),
            json!({"include": [{"area": "commands", "path": "s/commands"}, {"area": "files", "path": "s/files"}]})
        );
        let m = github_matrix(&folders, &["local".into(), "docker".into()]);
        assert_eq!(m["include"].as_array().unwrap().len(), 4);
        assert_eq!(m["include"][1], json!({"area": "commands", "path": "s/commands", "provider": "docker"}));
    }
}
