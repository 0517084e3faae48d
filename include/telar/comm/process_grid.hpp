#pragma once
/*! \file
 *  \brief telar::ProcessGrid: the world factored into data-, spatial-,
 *         pipeline- and tensor-parallel sub-communicators, and the
 *         model-parallel one.
 */

#include <telar/comm/communicator.hpp>
#include <telar/comm/error.hpp>
#include <telar/comm/topology.hpp>
#include <telar/core/detail/decl.hpp>

#include <array>
#include <sstream>
#include <string>

namespace telar {

/*! \brief One axis of the process grid. */
enum class GridAxis {
  dp, //!< data parallelism: replicas of the model on different samples
  pp, //!< pipeline parallelism: stages of the model's layers
  tp, //!< tensor parallelism: shards of a layer's matrices
  sp  //!< spatial parallelism: slabs of each sample (docs/spatial.md)
};

/*! \brief Degrees of parallelism; `dp = 0` means "whatever is left"
 *         (world size / (sp * pp * tp)). */
struct GridShape {
  int dp = 0; //!< data-parallel degree (0: deduced)
  int pp = 1; //!< pipeline-parallel degree
  int tp = 1; //!< tensor-parallel degree
  int sp = 1; //!< spatial-parallel degree: the ranks each sample is split over
  /*! \brief The degree along \p a. \param a an axis */
  int along(GridAxis a) const noexcept {
    return a == GridAxis::dp ? dp : a == GridAxis::pp ? pp : a == GridAxis::tp ? tp : sp;
  }
};

/*! \brief Order of the axes in the rank layout, outermost first.
 *
 *  The default `{pp, dp, sp, tp}` puts tp innermost, so the ranks of one
 *  tensor-parallel group are consecutive (usually on one node, on the
 *  fastest links), then the slabs of one sample (their halo exchanges the
 *  next busiest), then dp, then pp:
 *  `world_rank = ((pp_rank * dp + dp_rank) * sp + sp_rank) * tp + tp_rank`.
 *  At sp = 1 this is the layout of dp x pp x tp alone.
 */
using GridOrder = std::array<GridAxis, 4>;

/*! \brief The default layout: pp outermost, then dp, sp, tp innermost. */
inline constexpr GridOrder default_grid_order = {GridAxis::pp, GridAxis::dp, GridAxis::sp,
                                                 GridAxis::tp};

/*! \brief A named sub-communicator of the grid (see ProcessGrid::group()). */
enum class GridGroup {
  world, //!< every rank of the grid
  dp,    //!< same pp, tp and sp coordinates: the replicas that reduce gradients
  pp,    //!< same dp, tp and sp coordinates: the stages of one pipeline
  tp,    //!< same dp, pp and sp coordinates: the shards of one tensor-parallel layer
  mp,    //!< same dp coordinate: every rank that holds a part of one model replica
  sp     //!< same dp, pp and tp coordinates: the slabs of one sample
};

/*! \brief Coordinates of a rank on the grid. */
struct GridCoord {
  int dp = 0; //!< rank within the data-parallel group
  int pp = 0; //!< pipeline stage
  int tp = 0; //!< rank within the tensor-parallel group
  int sp = 0; //!< slab of each sample: rank within the spatial group
  /*! \brief The coordinate along \p a. \param a an axis */
  int& along(GridAxis a) noexcept {
    return a == GridAxis::dp ? dp : a == GridAxis::pp ? pp : a == GridAxis::tp ? tp : sp;
  }
  /*! \brief The coordinate along \p a. \param a an axis */
  int along(GridAxis a) const noexcept { return const_cast<GridCoord&>(*this).along(a); }
};

/*! \brief The world communicator factored into dp × sp × pp × tp.
 *
 *  With the default order,
 *  `world_rank = ((pp_rank * dp + dp_rank) * sp + sp_rank) * tp + tp_rank`
 *  (tp innermost, pp outermost); pass a telar::GridOrder to change it.
 *  Without one, a world spread over several nodes gets node_aware_order()'s
 *  `{dp, pp, sp, tp}`, which keeps each model replica's pipeline on its
 *  node. Each process belongs to one group per axis: the ranks whose
 *  coordinates differ from its own on that axis only (dp: same pp, tp and
 *  sp; ...); its rank in each sub-communicator equals its coordinate on
 *  that axis. The sp group holds the slabs of one sample (docs/spatial.md:
 *  a telar::SlabGraph is built over it, telar::SlabDataParallel takes the
 *  grid).
 *
 *  A shape that does not fit the world throws telar::GridError with the same
 *  message on every rank, before any communication.
 *
 *  \code
 *  telar::Communicator world(app_comm, "world"); // app_comm: the application's MPI_Comm
 *  telar::ProcessGrid grid(world, telar::GridShape{0, 2, 2}); // dp deduced, pp=2, tp=2
 *  grid.dp().allreduce(grads.data(), grads.size());
 *  telar::GridShape split;
 *  split.sp = 2; // each sample over 2 ranks, dp deduced
 *  telar::ProcessGrid volumes(world, split);
 *  \endcode
 */
class ProcessGrid {
public:
  /*! \brief Builds the grid with the rank layout chosen from the nodes
   *  (node_aware_order(); collective over \p world).
   *  \param world communicator to factor (duplicated; not used directly)
   *  \param shape degrees; dp = 0 takes what sp, pp and tp leave
   *  \throws telar::GridError if the shape does not fit (before any communication)
   */
  ProcessGrid(Communicator const& world, GridShape shape)
      : ProcessGrid(world, shape,
                    node_aware_order(resolve(world.size(), shape), node_layout(world))) {}

  /*! \brief Builds the grid and its sub-communicators (collective over \p world).
   *  \param world communicator to factor (duplicated; not used directly)
   *  \param shape degrees; dp = 0 takes what sp, pp and tp leave
   *  \param order axes from outermost to innermost
   *  \throws telar::GridError if the shape or the order does not fit
   */
  TELAR_DECL ProcessGrid(Communicator const& world, GridShape shape, GridOrder order);

  /*! \brief The (resolved) shape: dp is never 0 here. */
  GridShape shape() const noexcept { return shape_; }
  /*! \brief The axis order, outermost first. */
  GridOrder order() const noexcept { return order_; }
  /*! \brief This process's coordinates. */
  GridCoord coords() const noexcept { return coord_; }
  /*! \brief The whole grid (a duplicate of the communicator given). */
  Communicator const& world() const noexcept { return world_; }
  /*! \brief Processes with the same pp, tp and sp coordinates; rank = dp coordinate. */
  Communicator const& dp() const noexcept { return dp_; }
  /*! \brief Processes with the same dp, tp and sp coordinates; rank = pp coordinate. */
  Communicator const& pp() const noexcept { return pp_; }
  /*! \brief Processes with the same dp, pp and sp coordinates; rank = tp coordinate. */
  Communicator const& tp() const noexcept { return tp_; }
  /*! \brief Processes with the same dp, pp and tp coordinates, each holding
   *  one slab of the same samples; rank = sp coordinate. */
  Communicator const& sp() const noexcept { return sp_; }

  /*! \brief Processes with the same dp coordinate: the pipeline stages,
   *  slabs and tensor shards of one model replica (sums over the whole
   *  model, such as norms, run here). */
  Communicator const& mp() const noexcept { return mp_; }
  /*! \brief The sub-communicator named \p g. \param g which group */
  TELAR_DECL Communicator const& group(GridGroup g) const noexcept;

  /*! \brief The shape as text, e.g. "dp=2 x pp=1 x tp=2" (sp named when > 1). */
  std::string name() const { return describe(shape_); }

  /*! \brief World rank of the process at \p c.
   *  \param c coordinates, each within its degree
   */
  int rank_of(GridCoord c) const noexcept { return rank_in(shape_, order_, c); }

  /*! \brief Coordinates of world rank \p world_rank.
   *  \param world_rank rank in world(), in [0, world().size())
   */
  GridCoord coords_of(int world_rank) const noexcept {
    return coords_in(shape_, order_, world_rank);
  }

  /*! \brief The rank at \p c of a grid of \p shape laid out in \p order,
   *  without one (what a plan computes for any rank).
   *  \param shape resolved degrees \param order axes, outermost first
   *  \param c coordinates, each within its degree */
  static int rank_in(GridShape const& shape, GridOrder const& order, GridCoord const& c) noexcept {
    int r = 0;
    for (GridAxis a : order)
      r = r * shape.along(a) + c.along(a);
    return r;
  }

  /*! \brief The coordinates of \p rank in a grid of \p shape laid out in
   *  \p order, without one. \param shape resolved degrees
   *  \param order axes, outermost first \param rank in [0, product of the degrees) */
  static GridCoord coords_in(GridShape const& shape, GridOrder const& order, int rank) noexcept {
    GridCoord c;
    for (auto a = order.rbegin(); a != order.rend(); ++a) {
      c.along(*a) = rank % shape.along(*a);
      rank /= shape.along(*a);
    }
    return c;
  }

  /*! \brief Checks \p shape against \p world_size without communicating and
   *         returns it with dp resolved.
   *  \param world_size number of processes
   *  \param shape      requested degrees
   *  \param order      axis order (must name each axis once)
   *  \throws telar::GridError with a message that is the same on every rank
   */
  static GridShape resolve(int world_size, GridShape shape, GridOrder order = default_grid_order) {
    std::string const prefix = "telar::ProcessGrid: ";
    bool seen[4] = {false, false, false, false};
    for (GridAxis a : order)
      seen[static_cast<int>(a)] = true;
    if (!(seen[0] && seen[1] && seen[2] && seen[3]))
      throw GridError(prefix + "the axis order must name dp, sp, pp and tp once each");
    if (shape.dp < 0 || shape.pp <= 0 || shape.tp <= 0 || shape.sp <= 0) {
      throw GridError(prefix + "degrees must be positive (dp=0 means \"whatever is left\"); got " +
                      describe(shape));
    }
    if (shape.dp == 0) {
      int const rest = shape.sp * shape.pp * shape.tp;
      if (world_size % rest != 0) {
        std::string const axes = (shape.sp != 1 ? "sp=" + std::to_string(shape.sp) + " x " : "") +
                                 "pp=" + std::to_string(shape.pp) +
                                 " x tp=" + std::to_string(shape.tp);
        std::string const names = shape.sp != 1 ? "sp, pp and tp" : "pp and tp";
        std::ostringstream os;
        os << prefix << "world size " << world_size << " is not divisible by " << axes
           << " (product " << rest << "), so dp cannot be deduced; choose " << names
           << " whose product divides " << world_size;
        throw GridError(os.str());
      }
      shape.dp = world_size / rest;
    }
    long long const product = 1LL * shape.dp * shape.sp * shape.pp * shape.tp;
    if (product != world_size) {
      std::ostringstream os;
      os << prefix << "world size " << world_size << " does not fit " << describe(shape)
         << " (product " << product << "); choose degrees whose product is " << world_size;
      throw GridError(os.str());
    }
    return shape;
  }

  /*! \brief The rank layout for \p shape on \p nodes: `{dp, pp, sp, tp}`
   *  when the world spans several regular nodes (telar::NodeLayout::regular())
   *  of more than one rank, so tensor-parallel groups, then a sample's slabs,
   *  then pipelines, are consecutive ranks on one node and only the
   *  data-parallel dimension crosses nodes; default_grid_order otherwise (one
   *  node: the layout, and so every result, is the same as without node
   *  awareness).
   *  \param shape resolved degrees
   *  \param nodes node layout of the world (telar::node_layout)
   */
  TELAR_DECL static GridOrder node_aware_order(GridShape shape, NodeLayout const& nodes) noexcept;

  /*! \brief Formats a shape as "dp=2 x pp=1 x tp=2", or with sp > 1 as
   *  "dp=1 x sp=2 x pp=1 x tp=1".
   *  \param s shape to format
   */
  static std::string describe(GridShape s) {
    return "dp=" + std::to_string(s.dp) + (s.sp != 1 ? " x sp=" + std::to_string(s.sp) : "") +
           " x pp=" + std::to_string(s.pp) + " x tp=" + std::to_string(s.tp);
  }

private:
  GridShape shape_;
  GridOrder order_;
  GridCoord coord_;
  Communicator world_;
  Communicator dp_;
  Communicator pp_;
  Communicator tp_;
  Communicator sp_;
  Communicator mp_;
};

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/process_grid.ipp>
#endif
