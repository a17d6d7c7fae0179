//! The steps of a whole-workload checkpoint as a sans-I/O plan: the coordinator's capture,
//! then the driver's native lock and checkpoint of every CUDA process, then (with CRIU) the
//! dump; and, when a step after the capture fails, the planned way back: undo the native
//! steps, run the restore phases from the host carriers, remove what the checkpoint wrote;
//! or, when that fails too, tell the survivors to fail-stop. The executor
//! ([`super::checkpoint_with`], [`super::resume_in_place`]) does each [`Task`] and feeds back
//! whether it worked; the plan alone says what comes next, so every abort path is a
//! transition the unit tests drive without processes. `E` is the executor's error type.

/// What the executor does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// The coordinator's capture (`prepare`: its phases and the published state). Its own
    /// run decides what a failure means (nothing changed, rolled back, or fail-stop).
    Prepare,
    /// Write which processes the checkpoint covers beside the state.
    RecordMembers,
    /// `cuCheckpointProcessLock` of every CUDA process.
    NativeLock,
    /// `cuCheckpointProcessCheckpoint` of every CUDA process.
    NativeCheckpoint,
    /// `criu dump` of the tree.
    CriuDump,
    /// The way back: restore the processes that were checkpointed natively and unlock the
    /// locked ones.
    NativeUndo,
    /// The way back: the coordinator's restore phases from the carriers the shims still
    /// hold, ending with the record-by-record comparison.
    Resume,
    /// The way back worked: remove what the checkpoint wrote into its directory.
    Discard,
    /// The way back failed: tell every participant still alive to fail-stop.
    TellSurvivors,
    /// Nothing more to do: take the [`Verdict`].
    Finished,
}

impl Task {
    /// How a failure of this step is named in reports ("aborted during …").
    pub fn during(self) -> &'static str {
        match self {
            Self::Prepare => "prepare",
            Self::RecordMembers | Self::NativeLock | Self::NativeCheckpoint => "native checkpoint",
            Self::CriuDump => "criu dump",
            Self::NativeUndo | Self::Resume | Self::Discard | Self::TellSurvivors => "rollback",
            Self::Finished => "nothing",
        }
    }
}

/// How the checkpoint ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<E> {
    /// Every step passed: the workload is checkpointed.
    Checkpointed,
    /// The capture itself failed, with its own error.
    NotTaken(E),
    /// `during` failed with `cause`; the workload was put back and resumes.
    Aborted { during: Task, cause: E },
    /// `during` failed with `cause`, and putting the workload back failed with `rollback`:
    /// the survivors were told to fail-stop.
    FailStop { during: Task, cause: E, rollback: E },
}

#[derive(Debug)]
pub struct Course<E> {
    step: Task,
    criu: bool,
    /// The step that failed after the capture, and why.
    cause: Option<(Task, E)>,
    rollback: Option<E>,
    not_taken: Option<E>,
}

impl<E> Course<E> {
    /// A checkpoint from the start, with a CRIU dump at its end when `criu`.
    pub fn checkpoint(criu: bool) -> Self {
        Self {
            step: Task::Prepare,
            criu,
            cause: None,
            rollback: None,
            not_taken: None,
        }
    }

    /// The way back for a checkpoint whose `during` step failed with `cause` outside this
    /// plan (the CRIU hook sees a dump fail that CRIU ran).
    pub fn aborted(during: Task, cause: E) -> Self {
        Self {
            step: Task::NativeUndo,
            criu: false,
            cause: Some((during, cause)),
            rollback: None,
            not_taken: None,
        }
    }

    pub fn step(&self) -> Task {
        self.step
    }

    /// The step that failed and sent the plan back, while it is on its way back.
    pub fn cause(&self) -> Option<(Task, &E)> {
        self.cause.as_ref().map(|(step, error)| (*step, error))
    }

    /// Feeds how the current step went. Does nothing once finished.
    pub fn feed(&mut self, result: Result<(), E>) {
        let step = self.step;
        self.step = match (step, result) {
            (Task::Finished, _) => Task::Finished,
            (Task::Prepare, Ok(())) => Task::RecordMembers,
            (Task::Prepare, Err(error)) => {
                self.not_taken = Some(error);
                Task::Finished
            }
            (Task::RecordMembers, Ok(())) => Task::NativeLock,
            (Task::NativeLock, Ok(())) => Task::NativeCheckpoint,
            (Task::NativeCheckpoint, Ok(())) if self.criu => Task::CriuDump,
            (Task::NativeCheckpoint | Task::CriuDump, Ok(())) => Task::Finished,
            (
                Task::RecordMembers | Task::NativeLock | Task::NativeCheckpoint | Task::CriuDump,
                Err(error),
            ) => {
                self.cause = Some((step, error));
                Task::NativeUndo
            }
            (Task::NativeUndo, Ok(())) => Task::Resume,
            (Task::Resume, Ok(())) => Task::Discard,
            (Task::NativeUndo | Task::Resume, Err(error)) => {
                self.rollback = Some(error);
                Task::TellSurvivors
            }
            // Best effort: a leftover file does not undo a resumed workload, nor does an
            // unanswered notice change a fail-stop.
            (Task::Discard | Task::TellSurvivors, _) => Task::Finished,
        };
    }

    /// The verdict, once the plan is [`Task::Finished`].
    pub fn verdict(self) -> Option<Verdict<E>> {
        if self.step != Task::Finished {
            return None;
        }
        Some(match (self.not_taken, self.cause, self.rollback) {
            (Some(error), _, _) => Verdict::NotTaken(error),
            (None, Some((during, cause)), Some(rollback)) => Verdict::FailStop {
                during,
                cause,
                rollback,
            },
            (None, Some((during, cause)), None) => Verdict::Aborted { during, cause },
            (None, None, _) => Verdict::Checkpointed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a plan, failing the steps in `fail` (each once) with their own name; returns
    /// the steps taken and the verdict.
    fn check(mut plan: Course<String>, fail: &[Task]) -> (Vec<Task>, Verdict<String>) {
        let mut taken = Vec::new();
        while plan.step() != Task::Finished {
            let step = plan.step();
            assert!(taken.len() < 20, "no end: {taken:?}");
            taken.push(step);
            let failed = fail.contains(&step) && !taken[..taken.len() - 1].contains(&step);
            plan.feed(if failed {
                Err(format!("{step:?}"))
            } else {
                Ok(())
            });
        }
        (taken, plan.verdict().expect("finished"))
    }

    use Task::*;

    #[test]
    fn a_checkpoint_takes_every_step_in_order() {
        let (taken, verdict) = check(Course::checkpoint(false), &[]);
        assert_eq!(
            taken,
            [Prepare, RecordMembers, NativeLock, NativeCheckpoint]
        );
        assert_eq!(verdict, Verdict::Checkpointed);
        let (taken, verdict) = check(Course::checkpoint(true), &[]);
        assert_eq!(
            taken,
            [
                Prepare,
                RecordMembers,
                NativeLock,
                NativeCheckpoint,
                CriuDump
            ]
        );
        assert_eq!(verdict, Verdict::Checkpointed);
    }

    #[test]
    fn a_failed_capture_is_its_own_verdict() {
        let (taken, verdict) = check(Course::checkpoint(true), &[Prepare]);
        assert_eq!(taken, [Prepare]);
        assert_eq!(verdict, Verdict::NotTaken("Prepare".into()));
    }

    #[test]
    fn every_step_after_the_capture_aborts_and_resumes() {
        for failed in [RecordMembers, NativeLock, NativeCheckpoint, CriuDump] {
            let (taken, verdict) = check(Course::checkpoint(true), &[failed]);
            let at = taken.iter().position(|s| *s == failed).expect("taken");
            assert_eq!(taken[at + 1..], [NativeUndo, Resume, Discard], "{failed:?}");
            assert_eq!(
                verdict,
                Verdict::Aborted {
                    during: failed,
                    cause: format!("{failed:?}")
                }
            );
        }
    }

    #[test]
    fn a_failed_way_back_tells_the_survivors() {
        for (failed, back) in [(NativeLock, NativeUndo), (CriuDump, Resume)] {
            let (taken, verdict) = check(Course::checkpoint(true), &[failed, back]);
            assert!(taken.ends_with(&[back, TellSurvivors]), "{taken:?}");
            assert!(!taken.contains(&Discard), "{taken:?}");
            assert_eq!(
                verdict,
                Verdict::FailStop {
                    during: failed,
                    cause: format!("{failed:?}"),
                    rollback: format!("{back:?}")
                }
            );
        }
        // Neither leftover files nor an unanswered notice change the verdict.
        let (_, verdict) = check(Course::checkpoint(false), &[NativeCheckpoint, Discard]);
        assert!(matches!(verdict, Verdict::Aborted { .. }), "{verdict:?}");
        let (_, verdict) = check(
            Course::checkpoint(false),
            &[NativeCheckpoint, Resume, TellSurvivors],
        );
        assert!(matches!(verdict, Verdict::FailStop { .. }), "{verdict:?}");
    }

    #[test]
    fn a_dump_failed_outside_the_plan_takes_the_way_back() {
        let (taken, verdict) = check(Course::aborted(CriuDump, "full disk".into()), &[]);
        assert_eq!(taken, [NativeUndo, Resume, Discard]);
        assert_eq!(
            verdict,
            Verdict::Aborted {
                during: CriuDump,
                cause: "full disk".into()
            }
        );
        let plan: Course<String> = Course::checkpoint(false);
        assert!(plan.verdict().is_none(), "no verdict before the end");
    }
}
