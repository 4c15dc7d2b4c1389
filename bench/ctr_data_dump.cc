// Writes Fulcrum's synthetic click data to a file, so that a reference
// implementation (bench/torch_ctr_reference.py) trains on exactly the
// examples a click job sees. Usage:
//   fulcrum-ctr-data-dump --out=FILE --examples=N --fields=F --vocabulary=V
//                         --dense=D --fm_dim=K --fm_scale=S --seed=SEED
// Format (little-endian): int64 train, int64 test, int32 fields, int32
// dense; then train and test examples, each: float label, float truth (the
// true click probability), D floats, F uint64 ids.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "worker/ctr_data.h"

ABSL_FLAG(std::string, out, "", "file to write");
ABSL_FLAG(int64_t, examples, 50000, "training examples (the test set is a fifth of it)");
ABSL_FLAG(int32_t, fields, 4, "categorical fields");
ABSL_FLAG(int64_t, vocabulary, 100, "ids per field");
ABSL_FLAG(int32_t, dense, 2, "dense features");
ABSL_FLAG(int32_t, fm_dim, 2, "the true model's latent width");
ABSL_FLAG(double, fm_scale, 0.5, "the latent values' standard deviation");
ABSL_FLAG(uint64_t, seed, 5, "the job's seed");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  fulcrum::SyntheticCtrSpec spec;
  spec.seed = absl::GetFlag(FLAGS_seed);
  spec.examples = absl::GetFlag(FLAGS_examples);
  spec.fields = absl::GetFlag(FLAGS_fields);
  spec.vocabulary = absl::GetFlag(FLAGS_vocabulary);
  spec.dense = absl::GetFlag(FLAGS_dense);
  spec.fm_dim = absl::GetFlag(FLAGS_fm_dim);
  spec.fm_scale = static_cast<float>(absl::GetFlag(FLAGS_fm_scale));
  if (absl::Status valid = fulcrum::ValidateSyntheticCtrSpec(spec); !valid.ok()) {
    std::fprintf(stderr, "%s\n", std::string(valid.message()).c_str());
    return 2;
  }
  FILE* out = std::fopen(absl::GetFlag(FLAGS_out).c_str(), "wb");
  if (out == nullptr) {
    std::perror("--out");
    return 2;
  }
  const int64_t counts[2] = {spec.examples, spec.examples / 5};
  const int32_t shape[2] = {spec.fields, spec.dense};
  std::fwrite(counts, sizeof(counts), 1, out);
  std::fwrite(shape, sizeof(shape), 1, out);
  for (int split = 0; split < 2; ++split) {
    std::vector<float> truth;
    const fulcrum::SparseDataset data = fulcrum::MakeSyntheticCtr(spec, split, 0, counts[split], &truth);
    for (int64_t e = 0; e < counts[split]; ++e) {
      std::fwrite(&data.labels[e], sizeof(float), 1, out);
      std::fwrite(&truth[e], sizeof(float), 1, out);
      std::fwrite(data.dense.data() + e * spec.dense, sizeof(float), spec.dense, out);
      std::fwrite(data.ids.data() + e * spec.fields, sizeof(uint64_t), spec.fields, out);
    }
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
