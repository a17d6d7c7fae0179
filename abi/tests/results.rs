//! The generated `CUresult` table agrees with cudarc's enum and with itself.

use cudarc::driver::sys::CUresult;
use cuinterpose_abi::results;

fn check(value: u32, name: &str, from_cudarc: CUresult) {
    assert_eq!(value, from_cudarc as u32, "{name}");
    assert_eq!(results::name(value), Some(name));
    assert_eq!(
        results::c_name(value).map(|c| c.to_str().expect("ASCII")),
        Some(name)
    );
}

#[test]
fn values_match_cudarc() {
    check(
        results::CUDA_SUCCESS,
        "CUDA_SUCCESS",
        CUresult::CUDA_SUCCESS,
    );
    check(
        results::CUDA_ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE",
        CUresult::CUDA_ERROR_INVALID_VALUE,
    );
    check(
        results::CUDA_ERROR_ILLEGAL_STATE,
        "CUDA_ERROR_ILLEGAL_STATE",
        CUresult::CUDA_ERROR_ILLEGAL_STATE,
    );
    check(
        results::CUDA_ERROR_UNKNOWN,
        "CUDA_ERROR_UNKNOWN",
        CUresult::CUDA_ERROR_UNKNOWN,
    );
}

#[test]
fn the_table_is_complete_sorted_and_consistent() {
    // The driver has at least 76 codes; cudarc's headers, over every version, more.
    assert!(results::ALL.len() >= 76, "{} codes", results::ALL.len());
    for pair in results::ALL.windows(2) {
        assert!(
            pair[0].0 < pair[1].0,
            "sorted, no duplicate values: {pair:?}"
        );
    }
    for (value, name) in results::ALL {
        assert_eq!(results::name(value), Some(name));
        assert!(name.starts_with("CUDA_"), "{name}");
    }
    assert_eq!(results::name(123_456), None);
    assert_eq!(results::c_name(123_456), None);
}
