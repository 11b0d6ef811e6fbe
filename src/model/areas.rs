//! The CI matrix over scenario folders (`scenario-run matrix`): one entry per folder (area)
//! under a root that holds scenario files, optionally crossed with providers.

use serde_json::{json, Value};

use super::expand_paths;

/// Why there is no matrix.
#[derive(Debug, thiserror::Error)]
pub enum AreasError {
    #[error("cannot read {root}: {source}")]
    ReadRoot { root: String, source: std::io::Error },
    #[error("no scenario files in {0} or the folders under it: the matrix would have no entry")]
    Empty(String),
}

/// The entries of the matrix, sorted, as `root/name`: each folder directly under `root` that
/// holds at least one scenario file (an area), and each scenario file directly in `root` (its
/// own entry: dropping it would leave it run by no job). Nothing to run is an error, not an
/// empty matrix (which would be a CI with no scenario job, and green).
pub fn folders(root: &str) -> Result<Vec<String>, AreasError> {
    let dir = std::fs::read_dir(root).map_err(|source| AreasError::ReadRoot { root: root.to_string(), source })?;
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
        return Err(AreasError::Empty(root.to_string()));
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
    fn no_matrix_is_an_error_of_its_kind() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_string_lossy().into_owned();
        std::fs::create_dir(t.path().join("empty")).unwrap();
        assert!(matches!(folders(&root), Err(AreasError::Empty(r)) if r == root));
        let gone = format!("{root}/gone");
        assert!(matches!(folders(&gone), Err(AreasError::ReadRoot { root, .. }) if root == gone));
        std::fs::write(t.path().join("empty/a.yaml"), "name: a\nsteps: []\n").unwrap();
        assert_eq!(folders(&root).unwrap(), [format!("{root}/empty")]);
    }

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
