fn main() {
    let path = std::env::args().nth(1).unwrap();
    match cuinterpose_codegen::compile_file(std::path::Path::new(&path)) {
        Ok(ir) => println!("{:#?}", ir.messages),
        Err(e) => eprintln!("{e}"),
    }
}
