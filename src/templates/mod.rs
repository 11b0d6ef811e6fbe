//! Template folders: `template.yaml`, the `Dockerfile` subset, and the folder's content hash.
//! (Not the `{{ }}` expressions in a scenario's strings: those are [`crate::expr`].)
//!
//! A template folder holds a `Dockerfile` (parsed by [`dockerfile`]), a `template.yaml`
//! (parsed here into [`TemplateDef`]) and whatever files the Dockerfile copies. The folder's
//! [`digest`] (SHA-256 over every file's relative path, executable bit and content, bytecode
//! caches left out) keys builds: one build per digest per run.
//!
//! Folders are found by name ([`find_dir`]): `$SCENARIO_RUN_TEMPLATES_DIR/<name>` when that is
//! set, else the nearest `templates/<name>` above the scenario file, else `./templates/<name>`.

pub mod dockerfile;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::diag::{did_you_mean, Diagnostic, Source};
use crate::yaml::{Node, Value};

pub use dockerfile::Dockerfile;

/// `template.yaml`.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct TemplateDef {
    pub name: String,
    pub description: Option<String>,
    pub cpu: Option<u32>,
    /// MiB.
    pub memory: Option<u64>,
    /// The sandbox's disk, MiB (on the local provider; E2B's and FC's own disk sizes are the
    /// platform's).
    pub disk: Option<u64>,
    /// Run once in the background when a sandbox is created from the deployed template.
    pub start_command: Option<String>,
    /// Polled after the start command until it exits 0.
    pub ready_command: Option<String>,
    /// How long the ready command may keep failing before the create (or deploy) fails with
    /// its last exit code and output; the provider's own bound when `None` (local: 180 s).
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_secs")]
    pub ready_timeout: Option<std::time::Duration>,
    pub ports: Vec<u16>,
    /// Environment of every process; an empty value is left to the caller (not set).
    pub envs: BTreeMap<String, String>,
    /// Credentials the template needs (for `requires.env` of its scenarios).
    pub secrets: Vec<String>,
    /// Template ids per provider for templates that exist there already (official ones).
    pub ids: BTreeMap<String, String>,
    /// The Dockerfile's name in the folder.
    pub dockerfile: String,
}

const KEYS: &[&str] = &[
    "name",
    "description",
    "cpu",
    "memory",
    "disk",
    "start_command",
    "ready_command",
    "ready_timeout",
    "ports",
    "envs",
    "secrets",
    "ids",
    "dockerfile",
];

/// Parses `template.yaml`; every problem is reported, each at its position.
pub fn parse_def(source: &Source) -> Result<TemplateDef, Vec<Diagnostic>> {
    let docs = crate::yaml::parse(source)?;
    let Some(root) = docs.first() else {
        return Err(vec![Diagnostic::new(source, 1, 1, 1, "template.yaml is empty")]);
    };
    let Some(map) = root.as_map() else {
        return Err(vec![root.diag(source, format!("template.yaml must be a mapping, got {}", root.type_name()))]);
    };
    let mut errs = Vec::new();
    let mut def = TemplateDef { dockerfile: "Dockerfile".into(), ..Default::default() };
    let mut have_name = false;
    for (k, v) in map {
        let key = k.key_text();
        let mut bad =
            |v: &Node, what: &str| errs.push(v.diag(source, format!("`{key}` must be {what}, got {}", v.type_name())));
        match key.as_str() {
            "name" => match v.as_str() {
                Some(s) if !s.is_empty() => {
                    def.name = s.to_string();
                    have_name = true;
                }
                _ => bad(v, "a non-empty string"),
            },
            "description" => opt_str(v, &mut def.description, &mut bad),
            "start_command" => opt_str(v, &mut def.start_command, &mut bad),
            "ready_command" => opt_str(v, &mut def.ready_command, &mut bad),
            "ready_timeout" => match &v.value {
                Value::Int(i) if (1..=86_400).contains(i) => def.ready_timeout = Some(Duration::from_secs(*i as u64)),
                Value::Str(s) => match crate::duration::parse(s) {
                    Ok(d) if d > Duration::ZERO && d <= Duration::from_secs(86_400) => def.ready_timeout = Some(d),
                    _ => bad(v, "a duration from 1s to 24h (`30s`, `2m`, or seconds)"),
                },
                Value::Null => {}
                _ => bad(v, "a duration from 1s to 24h (`30s`, `2m`, or seconds)"),
            },
            "dockerfile" => match v.as_str() {
                Some(s) => def.dockerfile = s.to_string(),
                None => bad(v, "a string"),
            },
            "cpu" => match v.value {
                Value::Int(i) if (1..=1024).contains(&i) => def.cpu = Some(i as u32),
                Value::Null => {}
                _ => bad(v, "a positive integer"),
            },
            "memory" => match v.value {
                Value::Int(i) if i > 0 => def.memory = Some(i as u64),
                Value::Null => {}
                _ => bad(v, "a positive integer (MiB)"),
            },
            "disk" => match v.value {
                Value::Int(i) if (16..=1 << 20).contains(&i) => def.disk = Some(i as u64),
                Value::Null => {}
                _ => bad(v, "an integer number of MiB from 16 to 1048576"),
            },
            "ports" => match &v.value {
                Value::Seq(items) => {
                    for p in items {
                        match p.value {
                            Value::Int(i) if (1..=65535).contains(&i) => def.ports.push(i as u16),
                            _ => errs.push(p.diag(source, "a port must be an integer from 1 to 65535")),
                        }
                    }
                }
                Value::Null => {}
                _ => bad(v, "a list of ports"),
            },
            "secrets" => match &v.value {
                Value::Seq(items) => {
                    for s in items {
                        match s.as_str() {
                            Some(s) => def.secrets.push(s.to_string()),
                            None => errs.push(s.diag(source, "a secret is the name of a variable")),
                        }
                    }
                }
                Value::Null => {}
                _ => bad(v, "a list of variable names"),
            },
            "envs" | "ids" => match &v.value {
                Value::Map(m) => {
                    let target = if key == "envs" { &mut def.envs } else { &mut def.ids };
                    for (k2, v2) in m {
                        let text = match &v2.value {
                            Value::Str(s) => s.clone(),
                            Value::Int(i) => i.to_string(),
                            Value::Float(f) => f.to_string(),
                            Value::Bool(b) => b.to_string(),
                            Value::Null => String::new(),
                            _ => {
                                errs.push(v2.diag(source, format!("`{key}.{}` must be a scalar", k2.key_text())));
                                continue;
                            }
                        };
                        target.insert(k2.key_text(), text);
                    }
                }
                Value::Null => {}
                _ => bad(v, "a mapping"),
            },
            other => {
                let d = k.diag(source, format!("unknown key `{other}` in template.yaml")).label("unknown key");
                errs.push(
                    d.help_opt(did_you_mean(other, KEYS.iter().copied()).map(|s| format!("did you mean `{s}`?"))),
                );
            }
        }
    }
    if !have_name && errs.is_empty() {
        errs.push(root.diag(source, "template.yaml has no `name`"));
    }
    if errs.is_empty() {
        Ok(def)
    } else {
        Err(errs)
    }
}

/// `ready_timeout` in the JSON of a template (`scenario-run check --json`): seconds.
mod opt_secs {
    pub fn serialize<S: serde::Serializer>(d: &Option<std::time::Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

fn opt_str(v: &Node, slot: &mut Option<String>, bad: &mut impl FnMut(&Node, &str)) {
    match &v.value {
        Value::Str(s) => *slot = Some(s.clone()),
        Value::Null => *slot = None,
        _ => bad(v, "a string or null"),
    }
}

/// A template folder that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template folder {} does not exist", .0.display())]
    NoFolder(PathBuf),
    /// `template.yaml` or the Dockerfile exists but cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// `template.yaml` does not parse or check: rendered with `file:line:col`.
    #[error("{}", render(.0))]
    Definition(Vec<Diagnostic>),
    /// The Dockerfile does not parse: rendered with `file:line:col`.
    #[error("{}", render(.0))]
    Dockerfile(Vec<Diagnostic>),
    /// The folder's digest could not be made.
    #[error("cannot hash {}: {source}", dir.display())]
    Hash { dir: PathBuf, source: std::io::Error },
}

fn render(diags: &[Diagnostic]) -> String {
    diags.iter().map(Diagnostic::render).collect::<Vec<_>>().join("")
}

/// A template folder, loaded and checked.
#[derive(Debug, Clone)]
pub struct TemplateDir {
    pub dir: PathBuf,
    pub def: TemplateDef,
    pub dockerfile: Dockerfile,
    /// `sha256:<hex>` of the folder's contents.
    pub digest: String,
}

impl TemplateDir {
    /// Loads `dir`: its `template.yaml` (optional: the folder name is then the name) and its
    /// Dockerfile (required). Errors are rendered with `file:line:col`.
    pub fn load(dir: &Path) -> Result<Self, TemplateError> {
        if !dir.is_dir() {
            return Err(TemplateError::NoFolder(dir.to_path_buf()));
        }
        let yaml_path = dir.join("template.yaml");
        let def = match std::fs::read_to_string(&yaml_path) {
            Ok(text) => {
                let src = Source::new(yaml_path.display().to_string(), text);
                parse_def(&src).map_err(TemplateError::Definition)?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TemplateDef {
                name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                dockerfile: "Dockerfile".into(),
                ..Default::default()
            },
            Err(source) => return Err(TemplateError::Read { path: yaml_path, source }),
        };
        let df_path = dir.join(&def.dockerfile);
        let text = match std::fs::read_to_string(&df_path) {
            Ok(text) => text,
            Err(source) => return Err(TemplateError::Read { path: df_path, source }),
        };
        let dockerfile = dockerfile::parse(&text).map_err(|errs| {
            let src = Source::new(df_path.display().to_string(), text.clone());
            TemplateError::Dockerfile(
                errs.iter().map(|e| Diagnostic::new(&src, e.line, e.col, 1, e.message.clone())).collect(),
            )
        })?;
        let digest = digest(dir).map_err(|source| TemplateError::Hash { dir: dir.to_path_buf(), source })?;
        Ok(Self { dir: dir.to_path_buf(), def, dockerfile, digest })
    }
}

fn skipped(name: &str) -> bool {
    name == "__pycache__" || name.ends_with(".pyc") || name == ".DS_Store"
}

/// `sha256:<hex>` over every file below `dir` (sorted relative paths, executable bit,
/// content; symlinks by target).
pub fn digest(dir: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(dir.join(&rel))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if skipped(&name) {
                continue;
            }
            let r = rel.join(&name);
            if e.file_type()?.is_dir() {
                stack.push(r);
            } else {
                files.push(r);
            }
        }
    }
    files.sort();
    let mut h = Sha256::new();
    for rel in files {
        let p = dir.join(&rel);
        let meta = std::fs::symlink_metadata(&p)?;
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        if meta.file_type().is_symlink() {
            h.update(b"l");
            h.update(std::fs::read_link(&p)?.to_string_lossy().as_bytes());
        } else {
            h.update(if meta.permissions().mode() & 0o111 != 0 { b"x" } else { b"f" });
            // Streamed: a context may hold files larger than memory should.
            let mut f = std::fs::File::open(&p)?;
            h.update(f.metadata()?.len().to_le_bytes());
            std::io::copy(&mut f, &mut h)?;
        }
        h.update([0]);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// The variable naming a folder of template folders, over the search from the scenario.
pub const TEMPLATES_DIR_ENV: &str = "SCENARIO_RUN_TEMPLATES_DIR";

/// Where the folder of template `name` is (see the module documentation); `root` is the
/// value of [`TEMPLATES_DIR_ENV`] in the run's environment.
pub fn find_dir(name: &str, scenario_dir: &Path, root: Option<&str>) -> PathBuf {
    if let Some(root) = root.filter(|v| !v.is_empty()) {
        return PathBuf::from(root).join(name);
    }
    let start = if scenario_dir.is_absolute() {
        scenario_dir.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(scenario_dir)
    };
    for d in start.ancestors() {
        let cand = d.join("templates").join(name);
        if cand.is_dir() {
            return cand;
        }
    }
    PathBuf::from("templates").join(name)
}

/// The id `create` sends for the template `name` on `provider`: `ids.<provider>` of the
/// template folder `name` (see [`find_dir`]) when it names one (the official templates' ids
/// in the cloud, e.g. `base` is `216g37mamkdfhzrauvxk` on alicloud), else `name` itself (a
/// template a run deployed, an id, a name the folder does not map). A folder whose
/// `template.yaml` is broken is an error, with `file:line:col`.
/// `root` is [`TEMPLATES_DIR_ENV`] as for [`find_dir`].
pub fn provider_id(
    name: &str,
    provider: &str,
    scenario_dir: &Path,
    root: Option<&str>,
) -> Result<String, TemplateError> {
    let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !plain {
        return Ok(name.to_string());
    }
    let yaml_path = find_dir(name, scenario_dir, root).join("template.yaml");
    let text = match std::fs::read_to_string(&yaml_path) {
        Ok(t) => t,
        Err(_) => return Ok(name.to_string()),
    };
    let src = Source::new(yaml_path.display().to_string(), text);
    let def = parse_def(&src).map_err(TemplateError::Definition)?;
    // Only the folder of that very template (its `name:`) speaks for it.
    if def.name != name {
        return Ok(name.to_string());
    }
    Ok(def.ids.get(provider).filter(|id| !id.is_empty()).cloned().unwrap_or_else(|| name.to_string()))
}

/// Everything a provider needs to build a template (the folder, parsed).
#[derive(Debug, Clone)]
pub struct BuildSpec {
    pub template: TemplateDir,
    /// `--build-arg`-style overrides of the Dockerfile's ARGs.
    pub build_args: BTreeMap<String, String>,
    /// Keep the build after the run.
    pub keep: bool,
    /// Build again, reusing nothing built before (the step's `skip_cache`, the template build
    /// API's `force`).
    pub skip_cache: bool,
    /// The login for the FROM image's registry (the template build API's `fromImageRegistry`).
    pub from_auth: Option<crate::image::RegistryAuth>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(text: &str) -> Result<TemplateDef, Vec<Diagnostic>> {
        parse_def(&Source::new("t/template.yaml", text))
    }

    #[test]
    fn parses_template_yaml() {
        let d = def("name: x\ncpu: 2\nmemory: 512\nstart_command: run it\nready_command: null\nports: [9000, 3000]\n\
                     envs: { A: 1, B: \"\" }\nsecrets: [K]\nids: { alicloud: abc }\n")
        .unwrap();
        assert_eq!(d.name, "x");
        assert_eq!((d.cpu, d.memory), (Some(2), Some(512)));
        assert_eq!(d.start_command.as_deref(), Some("run it"));
        assert_eq!(d.ready_command, None);
        assert_eq!(d.ports, [9000, 3000]);
        assert_eq!(d.envs["A"], "1");
        assert_eq!(d.ids["alicloud"], "abc");
        assert_eq!(d.dockerfile, "Dockerfile");
    }

    #[test]
    fn ready_timeout_is_a_bounded_duration_at_its_position() {
        assert_eq!(def("name: x\nready_timeout: 5s\n").unwrap().ready_timeout, Some(Duration::from_secs(5)));
        assert_eq!(def("name: x\nready_timeout: 90\n").unwrap().ready_timeout, Some(Duration::from_secs(90)));
        assert_eq!(def("name: x\n").unwrap().ready_timeout, None);
        for bad in ["0", "soon", "-3", "[1]", "48h"] {
            let errs = def(&format!("name: x\nready_timeout: {bad}\n")).unwrap_err();
            assert_eq!((errs[0].location.line, errs[0].location.col), (2, 16), "{bad}");
            assert!(errs[0].message.contains("`ready_timeout` must be a duration"), "{}", errs[0].message);
        }
        let typo = def("name: x\nready_timout: 5s\n").unwrap_err();
        assert_eq!(typo[0].help.as_deref(), Some("did you mean `ready_timeout`?"));
    }

    #[test]
    fn template_yaml_errors_have_positions() {
        let errs = def("name: x\nports: [9000, 99999]\nstart_comand: x\ncpu: two\n").unwrap_err();
        let at: Vec<(u32, u32)> = errs.iter().map(|d| (d.location.line, d.location.col)).collect();
        assert_eq!(at, [(2, 15), (3, 1), (4, 6)]);
        assert_eq!(errs[1].help.as_deref(), Some("did you mean `start_command`?"));
        assert!(def("cpu: 1\n").unwrap_err()[0].message.contains("no `name`"));
    }

    #[test]
    fn shipped_templates_load_and_hash_stably() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let mut names = Vec::new();
        for e in std::fs::read_dir(&root).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                let t = TemplateDir::load(&p).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(t.def.name, p.file_name().unwrap().to_string_lossy(), "name matches the folder");
                assert!(t.digest.starts_with("sha256:") && t.digest.len() == 71);
                assert_eq!(digest(&p).unwrap(), t.digest);
                names.push(t.def.name);
            }
        }
        names.sort();
        assert_eq!(names.len(), 12, "{names:?}");
        let ci = TemplateDir::load(&root.join("code-interpreter-v1")).unwrap();
        assert_eq!(ci.def.ids["alicloud"], "8d926meb1xzckz1a83ib");
        let base = TemplateDir::load(&root.join("base")).unwrap();
        assert_eq!(base.def.ids["alicloud"], "216g37mamkdfhzrauvxk");
    }

    #[test]
    fn digest_changes_with_content_and_ignores_bytecode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM x\n").unwrap();
        let a = digest(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("__pycache__")).unwrap();
        std::fs::write(dir.path().join("__pycache__/c.pyc"), "junk").unwrap();
        assert_eq!(digest(dir.path()).unwrap(), a);
        std::fs::write(dir.path().join("Dockerfile"), "FROM y\n").unwrap();
        assert_ne!(digest(dir.path()).unwrap(), a);
    }

    /// Issue 28 item 4: a folder that cannot be loaded says why by its kind.
    #[test]
    fn load_errors_have_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = TemplateDir::load(&missing).unwrap_err();
        assert!(matches!(&e, TemplateError::NoFolder(p) if *p == missing));
        assert_eq!(e.to_string(), format!("template folder {} does not exist", missing.display()));

        let e = TemplateDir::load(dir.path()).unwrap_err();
        assert!(
            matches!(&e, TemplateError::Read { path, source } if path.ends_with("Dockerfile") && source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        assert!(e.to_string().starts_with(&format!("cannot read {}: ", dir.path().join("Dockerfile").display())));

        let t = dir.path().join("t");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("template.yaml"), "name: t\nbogus: 1\n").unwrap();
        let e = TemplateDir::load(&t).unwrap_err();
        assert!(matches!(&e, TemplateError::Definition(ds) if !ds.is_empty()), "{e:?}");
        assert!(e.to_string().contains("template.yaml:2:1"), "{e}");
        let e = provider_id("t", "e2b", dir.path(), dir.path().to_str()).unwrap_err();
        assert!(matches!(e, TemplateError::Definition(_)), "{e:?}");
    }

    #[test]
    fn dockerfile_errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM x\nRUN ok\nADD a b\n").unwrap();
        let e = TemplateDir::load(dir.path()).unwrap_err();
        assert!(matches!(&e, TemplateError::Dockerfile(ds) if ds.len() == 1), "{e}");
        let e = e.to_string();
        assert!(e.contains("Dockerfile:3:1"), "{e}");
        assert!(e.contains("unsupported instruction ADD"), "{e}");
    }
}
