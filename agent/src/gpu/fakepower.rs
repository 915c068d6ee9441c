//! The fake GPUs' power, temperature and energy: a deterministic model, so that telemetry,
//! energy and cooling can be tested without a GPU.
//!
//! Power is set by the load the GPU's processes declare (memory share and utilization);
//! temperature follows power as a first-order lag (steady state `ambient + c_per_w * P`,
//! time constant `tau`) and so cools towards idle when the load goes; energy integrates
//! power. Between two readings the load is the one last seen, so the state at any instant is
//! a closed-form function of the loads and the elapsed time: the same readings at the same
//! instants give the same figures.

/// The constants of the model (one set for every fake GPU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerModel {
    /// Power with nothing running.
    pub idle_w: f64,
    /// Power with the memory full and utilization at 100 %.
    pub max_w: f64,
    /// Share of the dynamic power (above idle) that memory in use draws; the rest follows
    /// utilization.
    pub memory_share: f64,
    pub ambient_c: f64,
    /// Steady-state temperature rise per watt.
    pub c_per_w: f64,
    /// Thermal time constant, seconds: after `tau` at a new load, 63 % of the way there.
    pub tau_s: f64,
}

impl Default for PowerModel {
    /// Figures of the order of a 300 W data-centre GPU: 60 W idle at 39 °C, 300 W at 75 °C.
    fn default() -> Self {
        Self {
            idle_w: 60.0,
            max_w: 300.0,
            memory_share: 0.25,
            ambient_c: 30.0,
            c_per_w: 0.15,
            tau_s: 20.0,
        }
    }
}

impl PowerModel {
    /// Power drawn with `memory_frac` of the memory in use and `util_frac` utilization (each
    /// clamped to 0..=1).
    pub fn power_w(&self, memory_frac: f64, util_frac: f64) -> f64 {
        let m = memory_frac.clamp(0.0, 1.0);
        let u = util_frac.clamp(0.0, 1.0);
        self.idle_w
            + (self.max_w - self.idle_w) * (self.memory_share * m + (1.0 - self.memory_share) * u)
    }

    /// The temperature a constant power settles at.
    pub fn steady_c(&self, power_w: f64) -> f64 {
        self.ambient_c + self.c_per_w * power_w
    }
}

/// One fake GPU's state at its last reading.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuState {
    /// Seconds since the backend opened.
    pub at_s: f64,
    /// Power drawn since `at_s`, until the load changes.
    pub power_w: f64,
    pub temperature_c: f64,
    /// The total-energy counter, joules since the backend opened.
    pub energy_j: f64,
}

impl GpuState {
    /// An idle GPU that has been idle long enough to sit at its idle temperature.
    pub fn idle(model: &PowerModel, at_s: f64) -> Self {
        let p = model.power_w(0.0, 0.0);
        Self {
            at_s,
            power_w: p,
            temperature_c: model.steady_c(p),
            energy_j: 0.0,
        }
    }

    /// The state at `t_s` (not before the last reading), the power held meanwhile.
    pub fn at(&self, model: &PowerModel, t_s: f64) -> Self {
        let dt = (t_s - self.at_s).max(0.0);
        let steady = model.steady_c(self.power_w);
        Self {
            at_s: self.at_s + dt,
            power_w: self.power_w,
            temperature_c: steady + (self.temperature_c - steady) * (-dt / model.tau_s).exp(),
            energy_j: self.energy_j + self.power_w * dt,
        }
    }

    /// Advances to `t_s`, then applies the load seen now (it holds until the next reading).
    pub fn observe(&mut self, model: &PowerModel, t_s: f64, memory_frac: f64, util_frac: f64) {
        *self = self.at(model, t_s);
        self.power_w = model.power_w(memory_frac, util_frac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn power_follows_declared_memory_and_utilization() {
        let m = PowerModel::default();
        assert_eq!(m.power_w(0.0, 0.0), 60.0);
        assert_eq!(m.power_w(1.0, 1.0), 300.0);
        // Memory alone: a quarter of the 240 W dynamic range.
        assert_eq!(m.power_w(1.0, 0.0), 120.0);
        assert_eq!(m.power_w(0.5, 0.5), 60.0 + 240.0 * (0.125 + 0.375));
        // Out-of-range declarations are clamped, never extrapolated.
        assert_eq!(m.power_w(3.0, 2.0), 300.0);
        assert_eq!(m.power_w(-1.0, -1.0), 60.0);
    }

    #[test]
    fn known_values_of_a_load_step_and_its_cooling() {
        let m = PowerModel::default();
        let mut g = GpuState::idle(&m, 0.0);
        assert_eq!(g.temperature_c, 39.0);
        // Full load from t = 0.
        g.observe(&m, 0.0, 1.0, 1.0);
        // One time constant later: 63.2 % of the way from 39 to 75 °C; 20 s at 300 W.
        let s = g.at(&m, 20.0);
        assert!(
            close(s.temperature_c, 75.0 - 36.0 * (-1.0f64).exp(), 1e-9),
            "{s:?}"
        );
        assert!(close(s.temperature_c, 61.756, 1e-3), "{s:?}");
        assert!(close(s.energy_j, 6000.0, 1e-9), "{s:?}");
        // Idle again at 20 s: it cools towards 39 °C with the same constant, and the energy
        // counter only ever grows.
        g.observe(&m, 20.0, 0.0, 0.0);
        let c = g.at(&m, 40.0);
        let expected = 39.0 + (s.temperature_c - 39.0) * (-1.0f64).exp();
        assert!(close(c.temperature_c, expected, 1e-9), "{c:?}");
        assert!(close(c.energy_j, 6000.0 + 60.0 * 20.0, 1e-9), "{c:?}");
        assert!(close(g.at(&m, 1e6).temperature_c, 39.0, 1e-9));
    }

    #[test]
    fn readings_are_reproducible_whatever_the_sampling() {
        // The same load trajectory read at different instants gives the same state at the
        // end: readings in between do not change the figures.
        let m = PowerModel::default();
        let mut coarse = GpuState::idle(&m, 0.0);
        coarse.observe(&m, 0.0, 0.5, 0.8);
        coarse.observe(&m, 30.0, 0.0, 0.0);
        let mut fine = GpuState::idle(&m, 0.0);
        fine.observe(&m, 0.0, 0.5, 0.8);
        for i in 1..300 {
            fine.observe(&m, f64::from(i) * 0.1, 0.5, 0.8);
        }
        fine.observe(&m, 30.0, 0.0, 0.0);
        let (a, b) = (coarse.at(&m, 45.0), fine.at(&m, 45.0));
        assert!(close(a.energy_j, b.energy_j, 1e-6), "{a:?} {b:?}");
        assert!(close(a.temperature_c, b.temperature_c, 1e-9), "{a:?} {b:?}");
        // And a reading never goes back in time.
        assert_eq!(a.at(&m, 10.0), a);
    }
}
