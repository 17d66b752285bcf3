// pool_set.cpp — scopes, owners and the walk over every pool (see pool_set.h).
#include "pool_set.h"

#include <algorithm>
#include <stdexcept>

namespace amem {

// ================================================================ serving requests

BlockPool& PoolSet::routed(PoolKind kind, StreamId stream) {
  for (Route& route : routes_) {
    if (!route.filter(stream)) continue;
    if (std::find(route.served.begin(), route.served.end(), stream) == route.served.end())
      route.served.push_back(stream);
    return private_pool(route.id, kind);
  }
  return shared(kind);
}

// ================================================================ scopes

void PoolSet::open_scope(PoolId id, std::function<bool(StreamId)> filter) {
  auto& pool = private_[id];
  if (!pool) pool = std::make_unique<PrivatePool>(id);
  pool->users += 1;
  routes_.push_back(Route{id, std::move(filter), {}});
}

bool PoolSet::close_scope(PoolId id) {
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->id != id) continue;
    routes_.erase(it);
    return routes_.empty();
  }
  return false;
}

bool PoolSet::drop_failed_captures() {
  auto over = [](Route& r) {
    return !r.served.empty() && std::none_of(r.served.begin(), r.served.end(), r.filter);
  };
  const size_t before = routes_.size();
  routes_.erase(std::remove_if(routes_.begin(), routes_.end(), over), routes_.end());
  return before != routes_.size() && routes_.empty();
}

// ================================================================ owners

void PoolSet::release(PoolId id) {
  auto it = private_.find(id);
  if (it == private_.end()) return;  // never used, or already gone
  if (it->second->users > 0) it->second->users -= 1;  // at 0, freeable: Note [lazy pool release]
}

std::vector<PoolId> PoolSet::freeable() const {
  std::vector<PoolId> ids;
  for (const auto& [id, p] : private_)
    if (p->users == 0) ids.push_back(id);
  return ids;
}

BlockPool& PoolSet::private_pool(PoolId id, PoolKind kind) {
  PrivatePool& p = *private_.at(id);
  return kind == PoolKind::kSmall ? p.small : p.large;
}

std::vector<const BlockPool*> PoolSet::all() const {
  std::vector<const BlockPool*> pools{&small_, &large_};
  for (const auto& [id, p] : private_) pools.insert(pools.end(), {&p->small, &p->large});
  return pools;
}

bool PoolSet::ids_are_true() const {
  return std::all_of(private_.begin(), private_.end(),
                     [](const auto& entry) { return entry.first == entry.second->small.owner &&
                                                    entry.first == entry.second->large.owner; });
}

}  // namespace amem
