fn main() {
    println!("arbor: under construction");
}
