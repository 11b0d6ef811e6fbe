//! The CI matrix over scenario folders (`scenario-run matrix`): one entry per folder (area)
//! under a root that holds scenario files, optionally crossed with providers.

use serde_json::{json, Value};

use super::expand_paths;

/// The folders directly under `root` that hold at least one scenario file, sorted, as
/// `root/name`.
pub fn folders(root: &str) -> Result<Vec<String>, String> {
    let dir = std::fs::read_dir(root).map_err(|e| format!("cannot read {root}: {e}"))?;
    let mut folders: Vec<String> = dir
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter(|e| expand_paths(&[e.path().to_string_lossy().into_owned()]).is_ok())
        .map(|e| format!("{root}/{}", e.file_name().to_string_lossy()))
        .collect();
    folders.sort();
    Ok(folders)
}

/// GitHub Actions' `strategy.matrix` JSON: `{"include": [{area, path[, provider]}…]}`.
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
