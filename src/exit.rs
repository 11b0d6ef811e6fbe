//! The process's exit codes, defined once: the runner computes a run's from its results, the
//! commands return one, and `main` hands it to the process (docs/reference.md, "Outcomes and exit codes").

/// Why `scenario-run` exits as it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Everything asked for was done and passed.
    Ok,
    /// A scenario failed (or a strict known issue passed), or a check found a difference.
    Failed,
    /// The command line or a file it names is wrong; nothing was run.
    Usage,
    /// A scenario file is invalid; nothing was run.
    Invalid,
    /// The infrastructure failed (a provider, a report file) and no scenario failed.
    Infra,
    /// SIGINT, SIGTERM, SIGHUP or SIGQUIT ended the run.
    Interrupted,
}

impl Exit {
    /// The number the process exits with.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Invalid => 3,
            Exit::Infra => 4,
            Exit::Interrupted => 130,
        }
    }

    /// The exit for a number [`Exit::code`] gave (a run's summary keeps it as a number).
    pub fn from_code(code: i32) -> Self {
        match code {
            0 => Exit::Ok,
            1 => Exit::Failed,
            2 => Exit::Usage,
            3 => Exit::Invalid,
            130 => Exit::Interrupted,
            _ => Exit::Infra,
        }
    }
}

impl From<Exit> for i32 {
    fn from(e: Exit) -> i32 {
        i32::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for e in [Exit::Ok, Exit::Failed, Exit::Usage, Exit::Invalid, Exit::Infra, Exit::Interrupted] {
            assert_eq!(Exit::from_code(e.into()), e);
        }
    }
}
