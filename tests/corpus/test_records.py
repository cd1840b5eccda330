from mens.corpus.records import SCHEMA_VERSION, TrainPair, codegen_row


def test_codegen_row_names_lane_and_family_for_its_language_and_reads_back():
    row = codegen_row("toy", "Write f", "fn f() {}\n", category="toy_task_fn", rating=3, source="taskgen:seed=0:1:fn",
                      origin="synthetic", constructs=["fn"], expect={"decls": [["fn", "f"]]})
    assert list(row) == ["prompt", "response", "category", "rating", "schema_version", "source", "constructs", "lane",
                         "response_mode", "task_family", "origin", "expect"]
    assert (row["lane"], row["task_family"], row["schema_version"]) == ("toy_codegen", "toy_codegen", SCHEMA_VERSION)
    pair = TrainPair.model_validate(row)
    assert pair.chat() == [{"role": "user", "content": "Write f"}, {"role": "assistant", "content": "fn f() {}\n"}]
    assert "constructs" not in codegen_row("toy", "p", "r", category="c", rating=5, source="s", origin="requests")
