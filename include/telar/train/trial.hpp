#pragma once
/*! \file
 *  \brief telar::Trial and telar::TrialRecord: one configuration's training
 *  in a hyper-parameter search (telar/train/hpsearch.hpp). */
#include <telar/core/error.hpp>
#include <telar/train/search_space.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

namespace telar {

/*! \brief A configuration's loss is not finite: the search records it as
 *  diverged and goes on with the others. */
class DivergedError : public Error {
public:
  /*! \brief \param step the step that returned the loss (0: the evaluation)
   *  \param loss the loss */
  DivergedError(long long step, double loss) : Error(message(step, loss)), step_(step) {}
  /*! \brief The step that returned the loss (0: the evaluation after training). */
  long long step() const { return step_; }

private:
  static std::string message(long long step, double loss) {
    char v[32] = "nan"; // not "-nan": the same text on every platform
    if (!std::isnan(loss))
      std::snprintf(v, sizeof v, "%g", loss);
    return step > 0 ? "diverged at step " + std::to_string(step) + ": loss " + v
                    : std::string("diverged: validation loss ") + v;
  }
  long long step_;
};

/*! \brief What a search hands the training function of one configuration:
 *  the group's communicator, the configuration and this round's budget.
 *
 *  The function constructs its telar::Trainer over comm() (every rank of the
 *  group calls it together), trains budget() steps, calling check() with
 *  every step's loss, evaluates on the validation set and returns the result. */
class Trial {
public:
  /*! \brief \param comm the group's communicator \param config the configuration
   *  \param id its position in the search's list \param round 0-based round
   *  \param budget steps to train \param seed the search's seed */
  Trial(MPI_Comm comm, HyperParams const& config, int id, int round, long long budget,
        std::uint64_t seed)
      : comm_(comm), config_(&config), id_(id), round_(round), budget_(budget), seed_(seed) {}
  /*! \brief The group's communicator (pass it to the Trainer; never freed by the user). */
  MPI_Comm comm() const { return comm_; }
  /*! \brief The configuration to train. */
  HyperParams const& config() const { return *config_; }
  /*! \brief Its position in the search's list of configurations. */
  int id() const { return id_; }
  /*! \brief The round (0-based). */
  int round() const { return round_; }
  /*! \brief Steps to train, from scratch, this round. */
  long long budget() const { return budget_; }
  /*! \brief The search's seed, the same for every configuration (common random
   *  numbers: configurations differ by their hyper-parameters only). */
  std::uint64_t seed() const { return seed_; }
  /*! \brief Throws DivergedError when \p loss is not finite. The loss a step
   *  returns is reduced over the group, so every rank throws alike.
   *  \param step steps taken (1-based) \param loss the step's loss */
  void check(long long step, double loss) const {
    if (!std::isfinite(loss))
      throw DivergedError(step, loss);
  }

private:
  MPI_Comm comm_;
  HyperParams const* config_;
  int id_, round_;
  long long budget_;
  std::uint64_t seed_;
};

/*! \brief What a configuration's training function returns. */
struct TrialOutcome {
  double val_loss = std::numeric_limits<double>::quiet_NaN(); //!< validation loss (lower is better)
  double val_accuracy = 0; //!< validation accuracy in [0, 1] (0 when the loss has none)
  long long steps = 0;     //!< steps trained
};

/*! \brief Where a configuration ended. */
enum class TrialStatus {
  finished, //!< trained in the last round
  stopped,  //!< not promoted after some round
  diverged, //!< non-finite loss (DivergedError)
  failed,   //!< the training function threw (a layout that does not fit, ...)
};

/*! \brief "finished", "stopped", "diverged" or "failed". \param s the status */
inline char const* status_name(TrialStatus s) {
  constexpr char const* names[] = {"finished", "stopped", "diverged", "failed"}; // the enum's order
  return names[static_cast<int>(s)];
}

/*! \brief One configuration's line in the leaderboard: its last round's result. */
struct TrialRecord {
  int id = 0;                                 //!< position in the search's list
  HyperParams config;                         //!< the configuration
  TrialStatus status = TrialStatus::finished; //!< where it ended
  std::string reason; //!< why it stopped, diverged or failed (empty when finished)
  double val_loss = std::numeric_limits<double>::quiet_NaN(); //!< last round's validation loss
  double val_accuracy = 0;                                    //!< last round's validation accuracy
  long long steps = 0; //!< steps trained in its last round (the step it diverged at)
  int rounds = 0;      //!< rounds it took part in
  double seconds = 0;  //!< wall time spent on it, all rounds together
  int group = 0;       //!< group that trained it in its last round
};

} // namespace telar
