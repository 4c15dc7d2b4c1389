#include "scheduler/loss_curve.h"

#include <algorithm>
#include <cmath>

namespace fulcrum {

LossCurveBuilder::LossCurveBuilder(int32_t num_partitions)
    : num_partitions_(std::max(1, num_partitions)), furthest_(num_partitions_, -1) {}

void LossCurveBuilder::Add(const v1::StepLoss& loss, v1::LossCurve* curve) {
  if (curve->steps_per_point() < 1) curve->set_steps_per_point(1);
  if (loss.partition() < 0 || loss.partition() >= num_partitions_ || loss.step() < curve->steps() ||
      !std::isfinite(loss.loss())) {
    return;
  }
  int64_t& furthest = furthest_[loss.partition()];
  furthest = std::max(furthest, loss.step());
  auto [it, inserted] = pending_[loss.step()].emplace(loss.partition(), loss.loss());
  if (inserted) ++pending_count_;
  // Bounded: past kMaxPending losses the oldest step goes in as it is (an
  // ASP partition far behind the others).
  while (pending_count_ > kMaxPending && !pending_.empty()) AppendOldest(curve);
  AddReady(curve);
}

void LossCurveBuilder::AddReady(v1::LossCurve* curve) {
  const int64_t everyone = *std::min_element(furthest_.begin(), furthest_.end());
  while (!pending_.empty() && pending_.begin()->first <= everyone) AppendOldest(curve);
}

void LossCurveBuilder::AppendOldest(v1::LossCurve* curve) {
  auto step = pending_.begin();
  double sum = 0;
  for (const auto& [partition, value] : step->second) sum += value;
  pending_count_ -= static_cast<int>(step->second.size());
  Append(step->first, sum / static_cast<double>(step->second.size()), curve);
  pending_.erase(step);
}

void LossCurveBuilder::Flush(v1::LossCurve* curve) {
  if (curve->steps_per_point() < 1) curve->set_steps_per_point(1);
  while (!pending_.empty()) AppendOldest(curve);
}

void LossCurveBuilder::Append(int64_t step, double loss, v1::LossCurve* curve) {
  // A step no partition's loss reached (its reports were lost while the
  // scheduler was down) takes this step's loss, so that point i stays steps
  // [i * steps_per_point, ...).
  for (int64_t s = curve->steps(); s <= step; ++s) AppendOne(loss, curve);
}

void LossCurveBuilder::AppendOne(double loss, v1::LossCurve* curve) {
  const int64_t per_point = curve->steps_per_point();
  const int64_t in_last = curve->steps() - (static_cast<int64_t>(curve->loss_size()) - 1) * per_point;
  if (curve->loss_size() > 0 && in_last < per_point) {  // the last point is partial: fold the step in
    float& last = *curve->mutable_loss()->rbegin();
    last = static_cast<float>((static_cast<double>(last) * static_cast<double>(in_last) + loss) /
                              static_cast<double>(in_last + 1));
  } else {
    curve->add_loss(static_cast<float>(loss));
  }
  curve->set_steps(curve->steps() + 1);
  if (curve->loss_size() > kMaxPoints) Halve(curve);
}

void LossCurveBuilder::Coarsen(int max_points, v1::LossCurve* curve) {
  while (curve->loss_size() > std::max(1, max_points)) Halve(curve);
}

void LossCurveBuilder::Halve(v1::LossCurve* curve) {
  // Merge neighbours: half the points, twice the steps each (the last point
  // may be partial: weigh it by the steps it holds).
  const int64_t per_point = std::max<int64_t>(1, curve->steps_per_point());
  auto* points = curve->mutable_loss();
  const int n = points->size();
  const int64_t in_tail = curve->steps() - static_cast<int64_t>(n - 1) * per_point;
  int kept = 0;
  for (int i = 0; i + 1 < n; i += 2) {
    const double weight = i + 1 == n - 1 ? static_cast<double>(in_tail) : static_cast<double>(per_point);
    points->Set(kept++, static_cast<float>((static_cast<double>(points->Get(i)) * static_cast<double>(per_point) +
                                            static_cast<double>(points->Get(i + 1)) * weight) /
                                           (static_cast<double>(per_point) + weight)));
  }
  if (n % 2 == 1) points->Set(kept++, points->Get(n - 1));
  points->Truncate(kept);
  curve->set_steps_per_point(per_point * 2);
}

}  // namespace fulcrum
