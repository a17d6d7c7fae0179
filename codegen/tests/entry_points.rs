//! The shim's entry-point table: the committed module is what the generator makes from the
//! locked cudarc and schema/entry_points.ron (staleness, as rust-analyzer's sourcegen tests),
//! and a bad policy is rejected at its `file:line:column`.

use cuinterpose_codegen::entry_points::{Abi, Bindings, Function, Wrapper, plan};
use std::collections::BTreeMap;
use std::path::Path;

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_committed_table_is_up_to_date() {
    let generated = cuinterpose_codegen::entry_points_for(workspace()).expect("generate");
    assert_eq!(
        generated.len(),
        4,
        "the results, the names, the pass-throughs and the wrapper table"
    );
    let mut stale = Vec::new();
    for (path, text) in &generated {
        let path = workspace().join(path);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != *text {
            if std::env::var_os("CI").is_none() {
                std::fs::write(&path, text).expect("update the table");
            }
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} were stale{}; review and commit them",
        if std::env::var_os("CI").is_none() {
            " and have been regenerated"
        } else {
            ""
        }
    );
    // Deterministic: a second run gives the same bytes.
    assert_eq!(
        cuinterpose_codegen::entry_points_for(workspace()).expect("generate again"),
        generated
    );
}

fn bindings() -> Bindings {
    let function = |args: Vec<Abi>| Function { args, newest: None };
    let mut functions = BTreeMap::new();
    functions.insert(
        "cuInit".to_owned(),
        function(vec![Abi::Primitive("u32".into())]),
    );
    functions.insert(
        "cuMemcpyHtoD_v2".to_owned(),
        function(vec![
            Abi::Primitive("u64".into()),
            Abi::ConstPtr,
            Abi::Primitive("usize".into()),
        ]),
    );
    functions.insert("cuMemCreate".to_owned(), function(vec![Abi::MutPtr]));
    Bindings {
        source: "test bindings".into(),
        functions,
        results: BTreeMap::from([(0, "CUDA_SUCCESS".to_owned())]),
    }
}

/// Plans `policy` against the test bindings: the one error's text, or the table.
fn check(
    policy: &str,
    expected_error: Option<&str>,
) -> Option<cuinterpose_codegen::entry_points::Table> {
    match (plan("policy.ron", policy, &bindings()), expected_error) {
        (Ok(table), None) => Some(table),
        (Err(d), Some(expected)) => {
            let text = d.to_string();
            assert_eq!(text, expected);
            None
        }
        (Ok(table), Some(expected)) => panic!("accepted, expected {expected}: {table:?}"),
        (Err(d), None) => panic!("refused: {d}"),
    }
}

#[test]
fn a_good_policy_classifies_every_function() {
    let table = check(
        r#"(tracked: ["cuInit", "cuMemCreate"], extra: ["cudaGetDriverEntryPoint"],
            open: ["cuInit"], ptds: ["cuMemcpyHtoD_v2"], ptsz: [])"#,
        None,
    )
    .unwrap();
    let names: Vec<&str> = table.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "cuInit",
            "cuMemCreate",
            "cuMemcpyHtoD_v2",
            "cuMemcpyHtoD_v2_ptds",
            "cudaGetDriverEntryPoint"
        ]
    );
    let by = |n: &str| table.entries.iter().find(|e| e.name == n).unwrap().clone();
    assert!(by("cuInit").open && by("cuInit").wrapper == Wrapper::HandWritten);
    assert!(!by("cuMemCreate").open);
    assert_eq!(
        by("cuMemcpyHtoD_v2_ptds").wrapper,
        by("cuMemcpyHtoD_v2").wrapper
    );
    assert!(matches!(by("cuMemcpyHtoD_v2").wrapper, Wrapper::PassThrough(ref a) if a.len() == 3));
}

#[test]
fn a_bad_policy_is_rejected_where_it_is_written() {
    check(
        "(tracked: [\"cuInit\"], extra: [],\n open: [\"cuNoSuch\"], ptds: [], ptsz: [])",
        Some(
            "policy.ron:2:9: `cuNoSuch` is not a driver function of the bindings (test bindings) nor listed in `extra`",
        ),
    );
    check(
        "(tracked: [\"cuInit\", \"cuInit\"], extra: [], open: [], ptds: [], ptsz: [])",
        Some("policy.ron:1:12: `cuInit` appears twice in `tracked`"),
    );
    check(
        "(tracked: [\"cuMemCreate\"], extra: [\"cuInit\"], open: [], ptds: [], ptsz: [])",
        Some(
            "policy.ron:1:36: `cuInit` is declared by the driver bindings; list it in `tracked`, not `extra`",
        ),
    );
    check(
        "(tracked: [\"cuMemCreate\"], extra: [], open: [], ptds: [\"cuMemCreate\"], ptsz: [])",
        Some(
            "policy.ron:1:56: per-thread base `cuMemCreate` is hand-written; its variant would bypass the tracking",
        ),
    );
    check(
        "(tracked: [], extra: [], open: [], ptds: [], ptsz: [], more: [])",
        Some(
            "policy.ron:1:56: Unexpected field named `more` in `Policy`, expected one of `tracked`, `extra`, `open`, `ptds`, or `ptsz` instead",
        ),
    );
}

#[test]
fn bindings_are_read_with_abi_classes() {
    let text = r#"
        pub use self::cudaError_enum as CUresult;
        #[repr(u32)] pub enum cudaError_enum { CUDA_SUCCESS = 0 }
        #[repr(i32)] pub enum CUsigned_enum { A = -1 }
        pub type CUsigned = CUsigned_enum;
        pub type CUdeviceptr = u64;
        #[repr(C)] pub struct CUmemLocation_st { pub id: i32 }
        pub type CUmemLocation = CUmemLocation_st;
        pub type CUhostFn = Option<unsafe extern "C" fn(*mut ::core::ffi::c_void)>;
        #[cfg(any(feature = "cuda-11040"))]
        pub unsafe fn cuOld(a: u32) -> CUresult { CUresult::CUDA_SUCCESS }
        #[cfg(any(feature = "cuda-12000", feature = "cuda-13010"))]
        pub unsafe fn cuOld(a: CUdeviceptr, b: CUsigned, c: CUmemLocation, d: CUhostFn, e: *const u8) -> CUresult { CUresult::CUDA_SUCCESS }
        pub unsafe fn cuNotAResult() -> u32 { 0 }
    "#;
    let b = cuinterpose_codegen::entry_points::read_bindings("t.rs", text).unwrap();
    assert_eq!(b.functions.len(), 1, "{b:?}");
    assert_eq!(
        b.functions["cuOld"].args,
        [
            Abi::Primitive("u64".into()),
            Abi::Primitive("i32".into()),
            Abi::Struct("CUmemLocation_st".into()),
            Abi::MutPtr,
            Abi::ConstPtr
        ],
        "the newest definition, enums as their repr"
    );
    let unknown = cuinterpose_codegen::entry_points::read_bindings(
        "t.rs",
        "pub use self::e as CUresult; pub enum e { A } pub unsafe fn cuX(a: Mystery) -> CUresult { 0 }",
    )
    .unwrap_err();
    assert_eq!(unknown.to_string(), "t.rs:1:1: cuX: unknown type `Mystery`");
}
