//! GPU UUIDs as text: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form `nvidia-smi -L`,
//! `CUDA_VISIBLE_DEVICES` and `cuda-checkpoint --device-map` use for a `CUuuid`'s 16 bytes.

/// The text of a UUID.
pub fn gpu_uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The bytes of `GPU-` and 32 hex digits (dashes anywhere after the prefix are ignored); the
/// error says what is wrong with `text`.
pub fn parse_gpu_uuid(text: &str) -> Result<[u8; 16], String> {
    let hex: Vec<u8> = text
        .strip_prefix("GPU-")
        .ok_or_else(|| format!("{text:?} is not a GPU UUID (GPU-xxxxxxxx-…)"))?
        .bytes()
        .filter(|c| *c != b'-')
        .collect();
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    if hex.len() != 32 || !hex.iter().all(|c| digit(*c).is_some()) {
        return Err(format!(
            "{text:?} is not a GPU UUID (32 hex digits after GPU-)"
        ));
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = digit(hex[2 * i]).unwrap_or(0) << 4 | digit(hex[2 * i + 1]).unwrap_or(0);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_and_bad_text_says_why() {
        let bytes: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        let text = gpu_uuid_text(&bytes);
        assert_eq!(text, "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(parse_gpu_uuid(&text), Ok(bytes));
        assert_eq!(
            parse_gpu_uuid(&text.to_uppercase()),
            Ok(bytes),
            "hex in either case"
        );
        for (bad, why) in [
            ("00112233", "not a GPU UUID (GPU-"),
            ("GPU-12", "32 hex digits"),
            ("GPU-0011223344556677889aabbccddeefg", "32 hex digits"),
        ] {
            let error = parse_gpu_uuid(bad).expect_err(bad);
            assert!(error.contains(why), "{bad}: {error}");
        }
    }
}
